/*
 * knn_metric.h: everything the engine knows about each metric, in one
 * table. The enum (knn.h), the predicates below (C engine and CUDA code),
 * the glue's list of names and R's list of metrics (C_knn_metric_table)
 * all come from KNN_METRIC_TABLE; a metric is added here and nowhere else
 * but in its arithmetic (knn_exact.h).
 *
 * Columns: the enum constant; the R layer's name; whether it ranks by a
 * correlation (weight r, distance 1 - r, degenerate when constant or all
 * zero); whether nodes are centred (Pearson-like); whether candidates come
 * from a matrix product of fast vectors; how a fast score is formed from a
 * product panel's value (knn_score_kind).
 */
#ifndef KNN_METRIC_H
#define KNN_METRIC_H

#if defined(__CUDACC__)
#define KNN_HD __host__ __device__
#else
#define KNN_HD
#endif

/* How a fast score (smaller is closer) is formed from the value v a tile
 * product left: -v for correlations (-|v| for |Pearson|), |f_i|^2 +
 * |f_j|^2 - 2 v for distances; Manhattan tiles already hold the distance. */
typedef enum {
    KNN_SCORE_NEG = 0,
    KNN_SCORE_NEGABS,
    KNN_SCORE_DIST,
    KNN_SCORE_IDENT
} knn_score_kind;

#define KNN_METRIC_TABLE(X)                                                  \
    /* constant        name           corr centred product score */          \
    X(KNN_PEARSON,     "pearson",     1,   1,      1,      KNN_SCORE_NEG)    \
    X(KNN_COSINE,      "cosine",      1,   0,      1,      KNN_SCORE_NEG)    \
    X(KNN_EUCLIDEAN,   "euclidean",   0,   0,      1,      KNN_SCORE_DIST)   \
    X(KNN_SPEARMAN,    "spearman",    1,   1,      1,      KNN_SCORE_NEG)    \
    X(KNN_ABSPEARSON,  "abspearson",  1,   1,      1,      KNN_SCORE_NEGABS) \
    X(KNN_MANHATTAN,   "manhattan",   0,   0,      0,      KNN_SCORE_IDENT)  \
    X(KNN_SQEUCLIDEAN, "sqeuclidean", 0,   0,      1,      KNN_SCORE_DIST)

typedef enum {
#define KNN_X(constant, name, corr, centred, product, score) constant,
    KNN_METRIC_TABLE(KNN_X)
#undef KNN_X
    KNN_N_METRICS
} knn_metric;

/* One column of the table for metric m (0 for an unknown m). */
#define KNN_METRIC_COLUMN(m, column)                                         \
    switch (m) {                                                             \
        KNN_METRIC_TABLE(column)                                             \
    default: break;                                                          \
    }                                                                        \
    return 0

#define KNN_X_CORR(c, name, corr, centred, product, score)                   \
    case c: return corr;
#define KNN_X_CENTRED(c, name, corr, centred, product, score)                \
    case c: return centred;
#define KNN_X_PRODUCT(c, name, corr, centred, product, score)                \
    case c: return product;
#define KNN_X_SCORE(c, name, corr, centred, product, score)                  \
    case c: return score;
#define KNN_X_NAME(c, name, corr, centred, product, score)                   \
    case c: return name;

KNN_HD static inline int knn_is_correlation(knn_metric m)
{
    KNN_METRIC_COLUMN(m, KNN_X_CORR);
}

KNN_HD static inline int knn_is_centred(knn_metric m)
{
    KNN_METRIC_COLUMN(m, KNN_X_CENTRED);
}

KNN_HD static inline int knn_uses_product(knn_metric m)
{
    KNN_METRIC_COLUMN(m, KNN_X_PRODUCT);
}

KNN_HD static inline knn_score_kind knn_score_of(knn_metric m)
{
    switch (m) {
        KNN_METRIC_TABLE(KNN_X_SCORE)
    default: break;
    }
    return KNN_SCORE_IDENT;
}

/* The R layer's name of metric m, or NULL for an unknown m. */
static inline const char *knn_metric_name(knn_metric m)
{
    switch (m) {
        KNN_METRIC_TABLE(KNN_X_NAME)
    default: break;
    }
    return 0;
}

#endif

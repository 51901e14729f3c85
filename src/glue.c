/*
 * glue.c: the .Call entry points. Each reads in four steps: convert input,
 * call the engine, convert output, return. The R layer (R/validate.R) has
 * already checked and converted the arguments; engine errors become R errors
 * only after the engine has freed its buffers.
 */
#include <R.h>
#include <Rinternals.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "callbacks.h"
#include "knn.h"

/* The most rows an R data frame holds (R_xlen_t vectors may be longer,
 * but row names and most of R's data frame code stop at int). */
#define KNN_MAX_EDGES 2147483647

static const char *knn_status_name(knn_status st)
{
    switch (st) {
    case KNN_E_INVALID: return "invalid input";
    case KNN_E_NOMEM: return "out of memory";
    case KNN_E_INTERRUPTED: return "interrupted by the user";
    case KNN_E_NOGPU: return "no usable GPU";
    case KNN_E_DEVICE: return "GPU failure";
    case KNN_E_NONFINITE: return "non-finite values";
    case KNN_E_DEGENERATE: return "nodes the metric cannot use";
    default: return "engine error";
    }
}

static SEXP knn_named_list(int n, const char **names)
{
    SEXP list = PROTECT(allocVector(VECSXP, n));
    SEXP nm = PROTECT(allocVector(STRSXP, n));
    for (int i = 0; i < n; i++) SET_STRING_ELT(nm, i, mkChar(names[i]));
    setAttrib(list, R_NamesSymbol, nm);
    UNPROTECT(2);
    return list;
}

static SEXP knn_report_list(const knn_report *report)
{
    const char *names[] = {"device", "precision", "seconds_setup",
                           "seconds_prepare", "seconds_search",
                           "seconds_rerank", "seconds_collect", "candidates",
                           "row_tile", "col_tile", "pairs_once"};
    SEXP info = PROTECT(knn_named_list(11, names));
    SET_VECTOR_ELT(info, 0, mkString(report->device));
    SET_VECTOR_ELT(info, 1, mkString(report->precision));
    SET_VECTOR_ELT(info, 2, ScalarReal(report->seconds_setup));
    SET_VECTOR_ELT(info, 3, ScalarReal(report->seconds_prepare));
    SET_VECTOR_ELT(info, 4, ScalarReal(report->seconds_search));
    SET_VECTOR_ELT(info, 5, ScalarReal(report->seconds_rerank));
    SET_VECTOR_ELT(info, 6, ScalarReal(report->seconds_collect));
    SET_VECTOR_ELT(info, 7, ScalarReal(report->candidates));
    SET_VECTOR_ELT(info, 8, ScalarInteger(report->row_tile));
    SET_VECTOR_ELT(info, 9, ScalarInteger(report->col_tile));
    SET_VECTOR_ELT(info, 10, ScalarLogical(report->pairs_once));
    UNPROTECT(1);
    return info;
}

static void knn_request_devices(knn_request *req, SEXP devices)
{
    int n = length(devices);
    req->n_devices = n < KNN_MAX_DEVICES ? n : KNN_MAX_DEVICES;
    for (int i = 0; i < req->n_devices; i++)
        req->devices[i] = INTEGER(devices)[i];
}

/* A search's result list, and what the engine's late allocation
 * (knn_result.allocate) puts in it. */
typedef struct {
    SEXP res;      /* the list, protected by C_knn_search */
    int n, k, edges;
    knn_r_session *session;
    knn_result *out; /* the engine's view of it */
} knn_r_result;

/* The list: n x k matrices (index, distance, weight, info), or the
 * columns of an edge list in edge order (from, to, weight, distance,
 * rank, info); the arrays come later. */
static SEXP knn_result_list(int edges)
{
    const char *matrix_names[] = {"index", "distance", "weight", "info"};
    const char *edge_names[] = {"from", "to", "weight", "distance", "rank",
                                "info"};
    return edges ? knn_named_list(6, edge_names)
                 : knn_named_list(4, matrix_names);
}

/* Allocates the list's arrays and points r->out at them. R raises its
 * own error where it cannot (knn_r_catch() keeps it). */
static SEXP knn_result_arrays(void *data)
{
    const knn_r_result *r = data;
    knn_result *out = r->out;
    SEXP res = r->res;
    R_xlen_t m = (R_xlen_t)r->n * r->k;
    SET_VECTOR_ELT(res, r->edges ? 1 : 0, allocVector(INTSXP, m));
    SET_VECTOR_ELT(res, r->edges ? 3 : 1, allocVector(REALSXP, m));
    SET_VECTOR_ELT(res, 2, allocVector(REALSXP, m));
    if (r->edges) {
        SET_VECTOR_ELT(res, 0, allocVector(INTSXP, m));
        SET_VECTOR_ELT(res, 4, allocVector(INTSXP, m));
        out->from = INTEGER(VECTOR_ELT(res, 0));
        out->rank = INTEGER(VECTOR_ELT(res, 4));
    } else {
        SEXP dim = PROTECT(allocVector(INTSXP, 2));
        INTEGER(dim)[0] = r->n;
        INTEGER(dim)[1] = r->k;
        for (int i = 0; i < 3; i++) setAttrib(VECTOR_ELT(res, i),
                                              R_DimSymbol, dim);
        UNPROTECT(1);
    }
    out->index = INTEGER(VECTOR_ELT(res, r->edges ? 1 : 0));
    out->distance = REAL(VECTOR_ELT(res, r->edges ? 3 : 1));
    out->weight = REAL(VECTOR_ELT(res, 2));
    return R_NilValue;
}

/* knn_result.allocate: the engine asks for the arrays once it is under
 * way (a GPU search: while its devices search, so that R's collection
 * before a large allocation overlaps the search). */
static int knn_result_allocate_r(void *ctx, knn_result *out)
{
    knn_r_result *r = ctx;
    r->out = out;
    return knn_r_catch(r->session, knn_result_arrays, r);
}

/* The engine's view of the result: arrays to come through `r`. */
static void knn_result_late(knn_r_result *r, knn_result *out)
{
    memset(out, 0, sizeof *out);
    out->by_row = r->edges;
    out->index_base = 1;
    out->allocate = knn_result_allocate_r;
    out->allocate_ctx = r;
}

/* The result of a search that stopped for a reason R handles itself:
 * list(problem = list(status, message, condition)), status "interrupted"
 * (R raises `condition` again: the interrupt, or the error such as a time
 * limit, that the poll caught, or R's own error where it could not
 * allocate the result), "nonfinite" or "degenerate" (R names the
 * nodes; finding them costs a second read, so it is left to that rare
 * path). */
static SEXP knn_problem(knn_status st, const knn_report *report,
                        SEXP condition)
{
    const char *names[] = {"status", "message", "condition"};
    const char *status = st == KNN_E_INTERRUPTED ? "interrupted"
                       : st == KNN_E_NONFINITE ? "nonfinite" : "degenerate";
    SEXP problem = PROTECT(knn_named_list(3, names));
    SET_VECTOR_ELT(problem, 0, mkString(status));
    SET_VECTOR_ELT(problem, 1, mkString(report->message));
    SET_VECTOR_ELT(problem, 2, condition);
    const char *outer[] = {"problem"};
    SEXP res = PROTECT(knn_named_list(1, outer));
    SET_VECTOR_ELT(res, 0, problem);
    UNPROTECT(2);
    return res;
}

/* One of the knobs (knn_knobs), named in the integer vector `knobs`; 0
 * where it does not name it. */
static int knn_knob(SEXP knobs, const char *name)
{
    SEXP names = getAttrib(knobs, R_NamesSymbol);
    for (R_xlen_t i = 0; i < XLENGTH(knobs) && !isNull(names); i++)
        if (strcmp(CHAR(STRING_ELT(names, i)), name) == 0)
            return INTEGER(knobs)[i];
    return 0;
}

/* ref, query: p x n double matrices (query may be NULL); devices: 0-based
 * integer vector, empty for all; edges: TRUE for a self search's directed
 * edge list; algorithm, precision: the codes of knn_algorithm and
 * knn_precision; knobs: a named integer vector of the test and tuning
 * overrides (knn_knobs: select, block_nodes, stage_peers,
 * duplicates, keep_rows_in_tiles). R/engine.R's
 * .engineSearch() is the one caller, with every value checked. Returns
 * list(index, distance, weight, info) with n x k matrices, or
 * list(from, to, weight, distance, rank, info) with one element per edge,
 * grouped by `from`, ranks ascending. Nodes are 1-based.
 * An interrupt or refused nodes give knn_problem()'s list. */
/* Stops with an R error unless C_knn_search's arguments have the types
 * and shapes the engine trusts (the engine checks the values it is given:
 * k, the metric, sizes); before anything is allocated. */
static void knn_search_check(SEXP ref, SEXP query, SEXP devices,
                             SEXP edges, SEXP algorithm, SEXP precision,
                             SEXP knobs, int k)
{
    if (TYPEOF(ref) != REALSXP || !isMatrix(ref))
        error("knngpu: 'ref' must be a double matrix (features x nodes)");
    if (!isNull(query) && (TYPEOF(query) != REALSXP || !isMatrix(query) ||
                           nrows(query) != nrows(ref)))
        error("knngpu: 'query' must be a double matrix with the %d "
              "features of 'ref'", nrows(ref));
    if (TYPEOF(devices) != INTSXP)
        error("knngpu: 'devices' must be an integer vector");
    if (TYPEOF(knobs) != INTSXP ||
        (XLENGTH(knobs) > 0 && isNull(getAttrib(knobs, R_NamesSymbol))))
        error("knngpu: 'knobs' must be a named integer vector");
    int algo = asInteger(algorithm), prec = asInteger(precision);
    int select = knn_knob(knobs, "select");
    if (algo < KNN_ALGO_AUTO || algo > KNN_ALGO_CLUSTERS ||
        prec < KNN_PRECISION_AUTO || prec > KNN_PRECISION_TF32X3 ||
        select < KNN_SELECT_CHOOSE || select > KNN_SELECT_FORCE_FUSED_ROWS ||
        knn_knob(knobs, "block_nodes") < 0 ||
        knn_knob(knobs, "duplicates") < KNN_DUPLICATES_AUTO ||
        knn_knob(knobs, "duplicates") > KNN_DUPLICATES_EACH)
        error("knngpu: 'algorithm', 'precision' or 'knobs' holds an "
              "unknown code");
    if (asLogical(edges) == TRUE && isNull(query) &&
        (double)ncols(ref) * k > KNN_MAX_EDGES)
        error("knngpu: %d nodes with k = %d give more edges than a data "
              "frame holds (%d rows)", ncols(ref), k, KNN_MAX_EDGES);
}

SEXP C_knn_search(SEXP ref, SEXP query, SEXP k, SEXP metric, SEXP backend,
                  SEXP threads, SEXP memory, SEXP devices, SEXP progress,
                  SEXP edges, SEXP algorithm, SEXP precision, SEXP knobs)
{
    knn_search_check(ref, query, devices, edges, algorithm, precision, knobs,
                     asInteger(k));
    int nprot = 0;
    knn_request req;
    memset(&req, 0, sizeof req);
    req.metric = (knn_metric)asInteger(metric);
    req.p = nrows(ref);
    req.ref = REAL(ref);
    req.n_ref = ncols(ref);
    if (!isNull(query)) {
        req.query = REAL(query);
        req.n_query = ncols(query);
    }
    req.k = asInteger(k);
    req.threads = asInteger(threads);
    req.algorithm = (knn_algorithm)asInteger(algorithm);
    req.precision = (knn_precision)asInteger(precision);
    knn_knobs tuning;
    memset(&tuning, 0, sizeof tuning);
    tuning.select = (knn_select_force)knn_knob(knobs, "select");
    tuning.block_nodes = knn_knob(knobs, "block_nodes");
    tuning.stage_peers = knn_knob(knobs, "stage_peers");
    tuning.duplicates = knn_knob(knobs, "duplicates");
    tuning.keep_rows_in_tiles = knn_knob(knobs, "keep_rows_in_tiles");
    req.memory_bytes = asReal(memory);
    knn_request_devices(&req, devices);
    int nq = isNull(query) ? req.n_ref : req.n_query;
    int as_edges = asLogical(edges) == TRUE && isNull(query);

    knn_r_session session;
    knn_r_callbacks(&session, asLogical(progress) == TRUE, nq, &req.cb);
    PROTECT(session.bar); nprot++;
    PROTECT(session.caught); nprot++;
    knn_r_result late = {R_NilValue, nq, req.k, as_edges, &session, NULL};
    SEXP res = PROTECT(late.res = knn_result_list(as_edges)); nprot++;
    knn_result out;
    knn_result_late(&late, &out);

    knn_report report;
    knn_status st = knn_search(&req, &tuning, (knn_backend)asInteger(backend),
                               &out, &report);
    knn_r_callbacks_done(&session);
    if (st == KNN_E_INTERRUPTED || st == KNN_E_NONFINITE ||
        st == KNN_E_DEGENERATE) {
        SEXP problem = knn_problem(st, &report,
                                   VECTOR_ELT(session.caught, 0));
        UNPROTECT(nprot);
        return problem;
    }
    if (st != KNN_OK) {
        UNPROTECT(nprot);
        error("knngpu: %s: %s", knn_status_name(st), report.message);
    }

    SET_VECTOR_ELT(res, as_edges ? 5 : 3, knn_report_list(&report));
    UNPROTECT(nprot);
    return res;
}

/* x: numeric matrix (double or integer); threads: as a search's.
 * Returns the nodes in the engine's p x n layout, a double matrix; one
 * whose columns are the nodes is already in that layout and is returned as
 * it is. */
SEXP C_knn_nodes(SEXP x, SEXP by_rows, SEXP threads)
{
    int nrow = nrows(x), ncol = ncols(x), rows = asLogical(by_rows) == TRUE;
    if (!rows && TYPEOF(x) == REALSXP) return x;
    SEXP dbl = PROTECT(coerceVector(x, REALSXP));
    SEXP values = PROTECT(allocMatrix(REALSXP, rows ? ncol : nrow,
                                      rows ? nrow : ncol));
    knn_layout_nodes(REAL(dbl), nrow, ncol, rows, REAL(values),
                     asInteger(threads));
    UNPROTECT(2);
    return values;
}

/* The first `cap` of `found` offending nodes (0-based in `bad`) as a
 * 1-based integer vector, with the total count as attribute "count". */
static SEXP knn_bad_nodes(const int *bad, int found, int cap)
{
    int shown = found < cap ? found : cap;
    SEXP res = PROTECT(allocVector(INTSXP, shown));
    for (int i = 0; i < shown; i++) INTEGER(res)[i] = bad[i] + 1;
    setAttrib(res, install("count"), ScalarInteger(found));
    UNPROTECT(1);
    return res;
}

/* x: p x n double matrix. Returns the nodes holding NA, NaN or Inf (at most
 * max_bad of them, in order; knn_bad_nodes). On one thread: it runs once,
 * on the way to an error. */
SEXP C_knn_nonfinite(SEXP x, SEXP max_bad)
{
    int cap = asInteger(max_bad);
    int *bad = (int *)R_alloc((size_t)cap, sizeof(int));
    int found = knn_nonfinite_nodes(REAL(x), nrows(x), ncols(x), bad, cap,
                                    1);
    return knn_bad_nodes(bad, found, cap);
}

/* x: p x n double matrix. Returns the degenerate nodes (at most max_rows of
 * them, in order; knn_bad_nodes), on one thread as C_knn_nonfinite. */
SEXP C_knn_degenerate(SEXP x, SEXP metric, SEXP max_rows)
{
    int cap = asInteger(max_rows);
    int *rows = (int *)R_alloc((size_t)cap, sizeof(int));
    int found = knn_degenerate_nodes((knn_metric)asInteger(metric), REAL(x),
                                     nrows(x), ncols(x), rows, cap, 1);
    return knn_bad_nodes(rows, found, cap);
}

/* The SNN graph's arrays on their way into R: the engine's malloc'd
 * arrays, freed whether or not R's allocations succeed. */
typedef struct {
    int *from, *to;
    double *weight;
    size_t m;
} knn_snn_arrays;

static SEXP knn_snn_to_r(void *data)
{
    const knn_snn_arrays *g = data;
    const char *names[] = {"from", "to", "weight"};
    SEXP res = PROTECT(knn_named_list(3, names));
    SEXP rf = allocVector(INTSXP, (R_xlen_t)g->m);
    SET_VECTOR_ELT(res, 0, rf);
    SEXP rt = allocVector(INTSXP, (R_xlen_t)g->m);
    SET_VECTOR_ELT(res, 1, rt);
    SEXP rw = allocVector(REALSXP, (R_xlen_t)g->m);
    SET_VECTOR_ELT(res, 2, rw);
    memcpy(INTEGER(rf), g->from, g->m * sizeof(int));
    memcpy(INTEGER(rt), g->to, g->m * sizeof(int));
    memcpy(REAL(rw), g->weight, g->m * sizeof(double));
    UNPROTECT(1);
    return res;
}

static void knn_snn_release(void *data, Rboolean jump)
{
    knn_snn_arrays *g = data;
    (void)jump;
    free(g->from);
    free(g->to);
    free(g->weight);
    g->from = g->to = NULL;
    g->weight = NULL;
}

/* Stops with an R error unless index is an n x k integer matrix of node
 * numbers 1..n (no NA) and type a knn_snn_type: the engine trusts both. */
static void knn_snn_check(SEXP index, SEXP type)
{
    if (TYPEOF(index) != INTSXP || !isMatrix(index) || nrows(index) < 1 ||
        ncols(index) < 1)
        error("knngpu: the SNN graph needs a non-empty integer matrix of "
              "neighbours");
    int t = asInteger(type);
    if (t < KNN_SNN_RANK || t > KNN_SNN_JACCARD)
        error("knngpu: unknown SNN weighting %d", t);
    R_xlen_t len = XLENGTH(index);
    int n = nrows(index);
    const int *v = INTEGER(index);
    for (R_xlen_t i = 0; i < len; i++)
        if (v[i] < 1 || v[i] > n)
            error("knngpu: the SNN graph's neighbours must be node numbers "
                  "from 1 to %d; entry %.0f is %s", n, (double)i + 1,
                  v[i] == NA_INTEGER ? "NA" : "out of range");
}

/* index: n x k 1-based integer matrix of a self search. Returns
 * list(from, to, weight) with 1-based from < to, in (from, to) order.
 * Polls for interrupts, which it raises again once every array is freed. */
SEXP C_knn_snn(SEXP index, SEXP type)
{
    knn_snn_check(index, type);
    int n = nrows(index), k = ncols(index);
    knn_r_session session;
    knn_callbacks cb;
    knn_r_callbacks(&session, 0, n, &cb);
    PROTECT(session.bar);
    PROTECT(session.caught);
    knn_snn_arrays g = {NULL, NULL, NULL, 0};
    knn_status st = knn_snn_graph(INTEGER(index), n, k, 1,
                                  (knn_snn_type)asInteger(type), &cb,
                                  &g.from, &g.to, &g.weight, &g.m);
    if (st == KNN_E_INTERRUPTED) {
        knn_r_raise(VECTOR_ELT(session.caught, 0));
        UNPROTECT(2);
        return R_NilValue;
    }
    UNPROTECT(2);
    if (st != KNN_OK)
        error("knngpu: out of memory building the SNN graph of %d nodes "
              "with k = %d: lower k, or build it on a machine with more "
              "memory", n, k);
    if (g.m > (size_t)KNN_MAX_EDGES) {
        size_t m = g.m;
        knn_snn_release(&g, FALSE);
        error("knngpu: the SNN graph has %.0f edges, more than a data frame "
              "holds (%d rows): lower k, or use knnSearch() for the "
              "neighbour matrices", (double)m, KNN_MAX_EDGES);
    }
    SEXP cont = PROTECT(R_MakeUnwindCont());
    SEXP res = R_UnwindProtect(knn_snn_to_r, &g, knn_snn_release, &g, cont);
    UNPROTECT(1);
    return res;
}

/* What C_knn_symmetrize keeps across R's allocations: the reverse lists,
 * freed whether or not those succeed. */
typedef struct {
    knn_symmetry sym;
    SEXP to, weight, distance;
    int n, k, mutual;
    size_t m;
} knn_sym_job;

static SEXP knn_sym_to_r(void *data)
{
    knn_sym_job *j = data;
    const char *names[] = {"from", "to", "weight", "distance", "rank"};
    SEXP res = PROTECT(knn_named_list(5, names));
    SEXPTYPE types[] = {INTSXP, INTSXP, REALSXP, REALSXP, INTSXP};
    for (int c = 0; c < 5; c++)
        SET_VECTOR_ELT(res, c, allocVector(types[c], (R_xlen_t)j->m));
    knn_symmetry_out out = {
        INTEGER(VECTOR_ELT(res, 0)), INTEGER(VECTOR_ELT(res, 1)),
        INTEGER(VECTOR_ELT(res, 4)), REAL(VECTOR_ELT(res, 2)),
        REAL(VECTOR_ELT(res, 3))};
    size_t m;
    knn_symmetry_pairs(&j->sym, INTEGER(j->to), REAL(j->weight),
                       REAL(j->distance), j->n, j->k, 1, j->mutual, NULL,
                       &out, &m);
    UNPROTECT(1);
    return res;
}

static void knn_sym_release(void *data, Rboolean jump)
{
    knn_sym_job *j = data;
    (void)jump;
    knn_symmetry_free(&j->sym);
}

/* to, weight, distance: a self search's directed edge list of n nodes x k
 * in edge order (knnGraph's), to 1-based; mutual: TRUE keeps the pairs
 * both ends chose. Returns list(from, to, weight, distance, rank), each
 * pair once, from < to, in (from, to) order (knn_symmetry_pairs). Polls
 * for interrupts, which it raises again once its memory is freed. */
SEXP C_knn_symmetrize(SEXP to, SEXP weight, SEXP distance, SEXP k,
                      SEXP mutual)
{
    int kk = asInteger(k);
    if (TYPEOF(to) != INTSXP || TYPEOF(weight) != REALSXP ||
        TYPEOF(distance) != REALSXP || kk < 1 || XLENGTH(to) % kk != 0 ||
        XLENGTH(weight) != XLENGTH(to) || XLENGTH(distance) != XLENGTH(to) ||
        XLENGTH(to) / kk > INT_MAX)
        error("knngpu: a directed edge list of n x k integer targets and "
              "double weights and distances is needed");
    knn_sym_job j = {{NULL, NULL}, to, weight, distance,
                     (int)(XLENGTH(to) / kk), kk, asLogical(mutual) == TRUE,
                     0};
    const int *t = INTEGER(to);
    for (R_xlen_t e = 0; e < XLENGTH(to); e++)
        if (t[e] < 1 || t[e] > j.n)
            error("knngpu: edge %.0f's target is not a node from 1 to %d",
                  (double)e + 1, j.n);
    if (knn_symmetry_build(&j.sym, t, j.n, kk, 1) != KNN_OK)
        error("knngpu: out of memory symmetrising %d nodes x %d edges: "
              "lower k", j.n, kk);
    knn_r_session session;
    knn_callbacks cb;
    knn_r_callbacks(&session, 0, j.n, &cb);
    PROTECT(session.bar);
    PROTECT(session.caught);
    knn_status st = knn_symmetry_pairs(&j.sym, t, REAL(weight),
                                       REAL(distance), j.n, kk, 1, j.mutual,
                                       &cb, NULL, &j.m);
    if (st != KNN_OK) {
        knn_symmetry_free(&j.sym);
        if (st == KNN_E_INTERRUPTED)
            knn_r_raise(VECTOR_ELT(session.caught, 0));
        error("knngpu: out of memory symmetrising %d nodes x %d edges: "
              "lower k", j.n, kk);
    }
    SEXP cont = PROTECT(R_MakeUnwindCont());
    SEXP res = R_UnwindProtect(knn_sym_to_r, &j, knn_sym_release, &j, cont);
    UNPROTECT(3);
    return res;
}

/* One column of the device table: field `field` of each device. */
typedef enum { KNN_DEV_NAME, KNN_DEV_TOTAL, KNN_DEV_FREE, KNN_DEV_MAJOR,
               KNN_DEV_MINOR, KNN_DEV_SMS } knn_dev_field;

static SEXP knn_device_column(const knn_gpu_info *info, knn_dev_field field)
{
    int n = info->n_devices;
    SEXPTYPE type = field == KNN_DEV_NAME ? STRSXP
        : (field == KNN_DEV_TOTAL || field == KNN_DEV_FREE) ? REALSXP
        : INTSXP;
    SEXP col = PROTECT(allocVector(type, n));
    for (int i = 0; i < n; i++) {
        const knn_gpu_device *d = &info->device[i];
        switch (field) {
        case KNN_DEV_NAME: SET_STRING_ELT(col, i, mkChar(d->name)); break;
        case KNN_DEV_TOTAL: REAL(col)[i] = d->memory_total; break;
        case KNN_DEV_FREE: REAL(col)[i] = d->memory_free; break;
        case KNN_DEV_MAJOR: INTEGER(col)[i] = d->major; break;
        case KNN_DEV_MINOR: INTEGER(col)[i] = d->minor; break;
        case KNN_DEV_SMS: INTEGER(col)[i] = d->multiprocessors; break;
        }
    }
    UNPROTECT(1);
    return col;
}

/* Returns list(name, correlation): the engine's metrics in code order
 * (knn_metric.h), from which R's list of metrics comes. */
SEXP C_knn_metric_table(void)
{
    const char *names[] = {"name", "correlation"};
    SEXP res = PROTECT(knn_named_list(2, names));
    SEXP name = allocVector(STRSXP, KNN_N_METRICS);
    SET_VECTOR_ELT(res, 0, name);
    SEXP corr = allocVector(LGLSXP, KNN_N_METRICS);
    SET_VECTOR_ELT(res, 1, corr);
    for (int m = 0; m < KNN_N_METRICS; m++) {
        SET_STRING_ELT(name, m, mkChar(knn_metric_name((knn_metric)m)));
        LOGICAL(corr)[m] = knn_is_correlation((knn_metric)m);
    }
    UNPROTECT(1);
    return res;
}

/* path: where the CUDA backend's shared object is (knn_gpu_set_library).
 * Returns NULL. */
SEXP C_knn_gpu_library(SEXP path)
{
    knn_gpu_set_library(CHAR(STRING_ELT(path, 0)));
    return R_NilValue;
}

/* Returns what the GPU backend sees, as a list for R/gpuInfo.R. */
SEXP C_knn_gpu_info(void)
{
    knn_gpu_info info;
    knn_gpu_query(&info);
    const char *dev_names[] = {"name", "memory_total", "memory_free",
                               "major", "minor", "multiprocessors"};
    SEXP dev = PROTECT(knn_named_list(6, dev_names));
    for (int f = KNN_DEV_NAME; f <= KNN_DEV_SMS; f++)
        SET_VECTOR_ELT(dev, f, knn_device_column(&info, (knn_dev_field)f));
    const char *names[] = {"built_with_cuda", "reason", "runtime_version",
                           "driver_version", "devices"};
    SEXP res = PROTECT(knn_named_list(5, names));
    SET_VECTOR_ELT(res, 0, ScalarLogical(info.built_with_cuda));
    SET_VECTOR_ELT(res, 1, mkString(info.reason));
    SET_VECTOR_ELT(res, 2, ScalarInteger(info.runtime_version));
    SET_VECTOR_ELT(res, 3, ScalarInteger(info.driver_version));
    SET_VECTOR_ELT(res, 4, dev);
    UNPROTECT(2);
    return res;
}

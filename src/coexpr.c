/*
 * coexpr.c: the .Call entry points of the co-expression measures
 * (src/engine/knn_coexpr.h): bicor's transform and the pairwise-complete
 * search. R/coexpr.R is their one caller.
 */
#include <R.h>
#include <Rinternals.h>
#include <string.h>
#include "callbacks.h"
#include "knn_coexpr.h"

/* x: p x n double matrix of finite values. Returns its bicor transform
 * (p x n) with attributes "bad" (the first `max_bad` 1-based nodes
 * constant over their features) and "count" (how many there are). */
SEXP C_knn_bicor_nodes(SEXP x, SEXP threads, SEXP max_bad)
{
    int p = nrows(x), n = ncols(x), cap = asInteger(max_bad);
    SEXP out = PROTECT(allocMatrix(REALSXP, p, n));
    int *bad = (int *)R_alloc((size_t)cap + 1, sizeof(int));
    int found = knn_bicor_nodes(REAL(x), p, n, REAL(out), bad, cap,
                                asInteger(threads));
    if (found < 0) error("knngpu: out of memory in the bicor transform");
    int shown = found < cap ? found : cap;
    SEXP nodes = PROTECT(allocVector(INTSXP, shown));
    for (int i = 0; i < shown; i++) INTEGER(nodes)[i] = bad[i] + 1;
    setAttrib(out, install("bad"), nodes);
    setAttrib(out, install("count"), ScalarInteger(found));
    UNPROTECT(2);
    return out;
}

/* ref, query: p x n double matrices, NA where missing (query may be NULL
 * for a self search); measure: knn_pairwise_measure's code; gpu: the keys
 * on a GPU (the first of `devices`, an integer vector, or the first GPU;
 * `memory` bytes of it, 0: what is free). Returns
 * list(index, distance, weight, info) of n x k matrices (1-based, NA
 * where a node has fewer than k partners), or list(problem = list(status,
 * message, condition)) as C_knn_search does for an interrupt or infinite
 * values. */
SEXP C_knn_pairwise(SEXP ref, SEXP query, SEXP k, SEXP measure,
                    SEXP min_shared, SEXP threads, SEXP progress, SEXP gpu,
                    SEXP memory, SEXP devices)
{
    int nprot = 0;
    knn_pairwise_request req;
    memset(&req, 0, sizeof req);
    req.measure = (knn_pairwise_measure)asInteger(measure);
    req.p = nrows(ref);
    req.ref = REAL(ref);
    req.n_ref = ncols(ref);
    if (!isNull(query)) {
        req.query = REAL(query);
        req.n_query = ncols(query);
    }
    req.k = asInteger(k);
    req.min_shared = asInteger(min_shared);
    req.threads = asInteger(threads);
    req.backend = asInteger(gpu) ? KNN_BACKEND_GPU : KNN_BACKEND_CPU;
    req.memory_bytes = asReal(memory);
    req.n_devices = LENGTH(devices) < KNN_MAX_DEVICES ? LENGTH(devices)
                                                      : KNN_MAX_DEVICES;
    for (int i = 0; i < req.n_devices; i++)
        req.devices[i] = INTEGER(devices)[i];
    int nq = isNull(query) ? req.n_ref : req.n_query;

    knn_r_session session;
    knn_r_callbacks(&session, asLogical(progress) == TRUE, nq, &req.cb);
    PROTECT(session.bar); nprot++;
    PROTECT(session.caught); nprot++;
    const char *names[] = {"index", "distance", "weight", "info"};
    SEXP res = PROTECT(allocVector(VECSXP, 4)); nprot++;
    SEXP nm = PROTECT(allocVector(STRSXP, 4)); nprot++;
    for (int i = 0; i < 4; i++) SET_STRING_ELT(nm, i, mkChar(names[i]));
    setAttrib(res, R_NamesSymbol, nm);
    SET_VECTOR_ELT(res, 0, allocMatrix(INTSXP, nq, req.k));
    SET_VECTOR_ELT(res, 1, allocMatrix(REALSXP, nq, req.k));
    SET_VECTOR_ELT(res, 2, allocMatrix(REALSXP, nq, req.k));
    knn_result out;
    memset(&out, 0, sizeof out);
    out.index = INTEGER(VECTOR_ELT(res, 0));
    out.distance = REAL(VECTOR_ELT(res, 1));
    out.weight = REAL(VECTOR_ELT(res, 2));
    out.index_base = 1;

    knn_report report;
    knn_status st = knn_pairwise_search(&req, &out, &report);
    knn_r_callbacks_done(&session);
    if (st == KNN_E_INTERRUPTED || st == KNN_E_NONFINITE) {
        const char *pnames[] = {"status", "message", "condition"};
        SEXP problem = PROTECT(allocVector(VECSXP, 3)); nprot++;
        SEXP pn = PROTECT(allocVector(STRSXP, 3)); nprot++;
        for (int i = 0; i < 3; i++) SET_STRING_ELT(pn, i, mkChar(pnames[i]));
        setAttrib(problem, R_NamesSymbol, pn);
        SET_VECTOR_ELT(problem, 0, mkString(st == KNN_E_INTERRUPTED
                                            ? "interrupted" : "nonfinite"));
        SET_VECTOR_ELT(problem, 1, mkString(report.message));
        SET_VECTOR_ELT(problem, 2, VECTOR_ELT(session.caught, 0));
        SEXP wrap = PROTECT(allocVector(VECSXP, 1)); nprot++;
        setAttrib(wrap, R_NamesSymbol, mkString("problem"));
        SET_VECTOR_ELT(wrap, 0, problem);
        UNPROTECT(nprot);
        return wrap;
    }
    if (st != KNN_OK) {
        UNPROTECT(nprot);
        error("knngpu: %s", report.message);
    }
    const char *inames[] = {"device", "precision", "seconds_prepare",
                            "seconds_search", "candidates", "row_tile",
                            "col_tile", "seconds_setup"};
    SEXP info = PROTECT(allocVector(VECSXP, 8)); nprot++;
    SEXP in = PROTECT(allocVector(STRSXP, 8)); nprot++;
    for (int i = 0; i < 8; i++) SET_STRING_ELT(in, i, mkChar(inames[i]));
    setAttrib(info, R_NamesSymbol, in);
    SET_VECTOR_ELT(info, 0, mkString(report.device));
    SET_VECTOR_ELT(info, 1, mkString(report.precision));
    SET_VECTOR_ELT(info, 2, ScalarReal(report.seconds_prepare));
    SET_VECTOR_ELT(info, 3, ScalarReal(report.seconds_search));
    SET_VECTOR_ELT(info, 4, ScalarReal(report.candidates));
    SET_VECTOR_ELT(info, 5, ScalarInteger(report.row_tile));
    SET_VECTOR_ELT(info, 6, ScalarInteger(report.col_tile));
    SET_VECTOR_ELT(info, 7, ScalarReal(report.seconds_setup));
    SET_VECTOR_ELT(res, 3, info);
    UNPROTECT(nprot);
    return res;
}

/*
 * init.c: registers every .Call routine with its true arity.
 */
#include <R.h>
#include <Rinternals.h>
#include <R_ext/Rdynload.h>
#include "knn.h"
#include "knn_threads.h"

SEXP C_knn_search(SEXP, SEXP, SEXP, SEXP, SEXP, SEXP, SEXP, SEXP, SEXP,
                  SEXP, SEXP, SEXP, SEXP);
SEXP C_knn_nodes(SEXP, SEXP, SEXP);
SEXP C_knn_nonfinite(SEXP, SEXP);
SEXP C_knn_degenerate(SEXP, SEXP, SEXP);
SEXP C_knn_snn(SEXP, SEXP);
SEXP C_knn_symmetrize(SEXP, SEXP, SEXP, SEXP, SEXP);
SEXP C_knn_gpu_info(void);
SEXP C_knn_gpu_library(SEXP);
SEXP C_knn_metric_table(void);
SEXP C_knn_bicor_nodes(SEXP, SEXP, SEXP);
SEXP C_knn_pairwise(SEXP, SEXP, SEXP, SEXP, SEXP, SEXP, SEXP, SEXP, SEXP,
                    SEXP);
SEXP C_knn_stop_file(SEXP);

static const R_CallMethodDef knn_call_methods[] = {
    {"C_knn_search", (DL_FUNC)&C_knn_search, 13},
    {"C_knn_nodes", (DL_FUNC)&C_knn_nodes, 3},
    {"C_knn_nonfinite", (DL_FUNC)&C_knn_nonfinite, 2},
    {"C_knn_degenerate", (DL_FUNC)&C_knn_degenerate, 3},
    {"C_knn_snn", (DL_FUNC)&C_knn_snn, 2},
    {"C_knn_symmetrize", (DL_FUNC)&C_knn_symmetrize, 5},
    {"C_knn_gpu_info", (DL_FUNC)&C_knn_gpu_info, 0},
    {"C_knn_gpu_library", (DL_FUNC)&C_knn_gpu_library, 1},
    {"C_knn_metric_table", (DL_FUNC)&C_knn_metric_table, 0},
    {"C_knn_bicor_nodes", (DL_FUNC)&C_knn_bicor_nodes, 3},
    {"C_knn_pairwise", (DL_FUNC)&C_knn_pairwise, 10},
    {"C_knn_stop_file", (DL_FUNC)&C_knn_stop_file, 1},
    {NULL, NULL, 0}
};

void R_init_knngpu(DllInfo *dll)
{
    R_registerRoutines(dll, NULL, knn_call_methods, NULL, NULL);
    R_useDynamicSymbols(dll, FALSE);
    R_forceSymbols(dll, TRUE);
    knn_threads_init();
}

/* A search's GPU context outlives it (src/cuda/knn_gpu_context.cu); it
 * goes with the package. */
void R_unload_knngpu(DllInfo *dll)
{
    (void)dll;
    knn_gpu_release();
}

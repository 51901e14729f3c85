/*
 * callbacks.c: interrupt and progress for the engine. Both run R code inside
 * R_tryCatch() or R_ToplevelExec(), which catch the longjmp of an interrupt
 * or error, so the engine always returns through its own cleanup path. The
 * interrupt poll keeps the condition it caught, so that the glue can raise
 * it again once the engine has freed everything: R then sees a real
 * interrupt (or the error, e.g. setTimeLimit()'s) as if the engine had not
 * been there.
 */
#include <R.h>
#include <Rinternals.h>
#include <cli/progress.h>
#include "callbacks.h"

static SEXP knn_r_check_interrupt(void *unused)
{
    (void)unused;
    R_CheckUserInterrupt();
    return R_NilValue;
}

static SEXP knn_r_keep_condition(SEXP condition, void *ctx)
{
    knn_r_session *session = ctx;
    SET_VECTOR_ELT(session->caught, 0, condition);
    return R_NilValue;
}

int knn_r_catch(knn_r_session *session, SEXP (*body)(void *), void *data)
{
    SEXP classes = PROTECT(allocVector(STRSXP, 2));
    SET_STRING_ELT(classes, 0, mkChar("interrupt"));
    SET_STRING_ELT(classes, 1, mkChar("error"));
    R_tryCatch(body, data, classes, knn_r_keep_condition, session, NULL,
               NULL);
    UNPROTECT(1);
    return VECTOR_ELT(session->caught, 0) != R_NilValue;
}

static int knn_r_interrupted(void *ctx)
{
    return knn_r_catch(ctx, knn_r_check_interrupt, NULL);
}

typedef struct {
    SEXP bar;
    double done;
} knn_r_tick;

static void knn_r_progress_set(void *data)
{
    knn_r_tick *tick = data;
    cli_progress_set(tick->bar, tick->done);
}

static void knn_r_progress(void *ctx, double done, double total)
{
    knn_r_session *session = ctx;
    (void)total;
    if (session->bar == R_NilValue) return;
    knn_r_tick tick = {session->bar, done};
    R_ToplevelExec(knn_r_progress_set, &tick);
}

void knn_r_callbacks(knn_r_session *session, int show, double total,
                     knn_callbacks *cb)
{
    session->bar = show ? cli_progress_bar(total, R_NilValue) : R_NilValue;
    session->caught = allocVector(VECSXP, 1);
    cb->interrupted = knn_r_interrupted;
    cb->progress = knn_r_progress;
    cb->ctx = session;
}

void knn_r_callbacks_done(knn_r_session *session)
{
    if (session->bar != R_NilValue) cli_progress_done(session->bar);
}

void knn_r_raise(SEXP condition)
{
    SEXP ns = PROTECT(R_FindNamespace(mkString("knngpu")));
    const char *fn = inherits(condition, "error") ? "stop"
                                                  : ".signalInterrupt";
    SEXP call = PROTECT(lang2(install(fn), condition));
    eval(call, ns);
    UNPROTECT(2);
    error("knngpu: interrupted");
}

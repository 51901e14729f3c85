/*
 * callbacks.c: interrupt and progress for the engine. Both run R code inside
 * R_ToplevelExec(), which catches the longjmp of an interrupt or error, so
 * the engine always returns through its own cleanup path.
 */
#include <R.h>
#include <Rinternals.h>
#include <cli/progress.h>
#include "callbacks.h"

static void knn_r_check_interrupt(void *unused)
{
    (void)unused;
    R_CheckUserInterrupt();
}

static int knn_r_interrupted(void *ctx)
{
    (void)ctx;
    return !R_ToplevelExec(knn_r_check_interrupt, NULL);
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
    cb->interrupted = knn_r_interrupted;
    cb->progress = knn_r_progress;
    cb->ctx = session;
}

void knn_r_callbacks_done(knn_r_session *session)
{
    if (session->bar != R_NilValue) cli_progress_done(session->bar);
}

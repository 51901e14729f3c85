/*
 * callbacks.c: interrupt and progress for the engine. Both run R code inside
 * R_tryCatch() or R_ToplevelExec(), which catch the longjmp of an interrupt
 * or error, so the engine always returns through its own cleanup path. The
 * interrupt poll keeps the condition it caught, so that the glue can raise
 * it again once the engine has freed everything: R then sees a real
 * interrupt (or the error, e.g. setTimeLimit()'s) as if the engine had not
 * been there.
 *
 * A BiocParallel worker also stops when its search's stop file appears,
 * or the directory that holds it goes (R/parallel.R): an interrupt
 * reaches only the process that started the search, whose workers would
 * otherwise finish their blocks first, even after that process has gone
 * on (MulticoreParam does not wait for them) and removed the directory.
 */
#include <R.h>
#include <Rinternals.h>
#include <cli/progress.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "callbacks.h"
#include "knn_backend.h"

/* The stop file this process's searches watch and its directory (NULL:
 * none), and when they were last looked for: a file system lookup per
 * poll would cost more than the poll, and a tenth of a second keeps the
 * answer within one. */
static char *knn_r_stop_path;
static char *knn_r_stop_dir;
static double knn_r_stop_looked;

#define KNN_STOP_LOOK_SECONDS 0.1

static SEXP knn_r_check_interrupt(void *unused)
{
    (void)unused;
    R_CheckUserInterrupt();
    if (knn_r_stop_path) {
        double now = knn_seconds();
        if (now - knn_r_stop_looked >= KNN_STOP_LOOK_SECONDS) {
            knn_r_stop_looked = now;
            if (access(knn_r_stop_path, F_OK) == 0 ||
                access(knn_r_stop_dir, F_OK) != 0) {
                error("the search was stopped: the R session that started "
                      "it was interrupted");
            }
        }
    }
    return R_NilValue;
}

SEXP C_knn_stop_file(SEXP path)
{
    free(knn_r_stop_path);
    free(knn_r_stop_dir);
    knn_r_stop_path = knn_r_stop_dir = NULL;
    knn_r_stop_looked = 0;
    if (!isString(path) || XLENGTH(path) != 1 ||
        STRING_ELT(path, 0) == NA_STRING) {
        return R_NilValue;
    }
    const char *p = R_ExpandFileName(translateChar(STRING_ELT(path, 0)));
    const char *slash = strrchr(p, '/');
    size_t dir_len = slash ? (size_t)(slash - p) : 1;
    knn_r_stop_path = malloc(strlen(p) + 1);
    knn_r_stop_dir = malloc(dir_len + 1);
    if (!knn_r_stop_path || !knn_r_stop_dir) {
        free(knn_r_stop_path);
        free(knn_r_stop_dir);
        knn_r_stop_path = knn_r_stop_dir = NULL;
        error("cannot keep the stop file's path");
    }
    strcpy(knn_r_stop_path, p);
    memcpy(knn_r_stop_dir, slash ? p : ".", dir_len);
    knn_r_stop_dir[dir_len] = '\0';
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

/* Seconds between two interrupt polls that reach R. A poll runs R code
 * (R_tryCatch), and the engine polls between tiles, which in a small
 * search take less time than the poll. Ctrl-C still reaches the engine
 * well within a second, and a search shorter than this interval answers
 * it as it returns. */
#define KNN_POLL_SECONDS 0.02

static int knn_r_interrupted(void *ctx)
{
    knn_r_session *session = ctx;
    if (VECTOR_ELT(session->caught, 0) != R_NilValue) return 1;
    double now = knn_seconds();
    if (now < session->next_poll) return 0;
    session->next_poll = now + KNN_POLL_SECONDS;
    return knn_r_catch(session, knn_r_check_interrupt, NULL);
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
    session->next_poll = knn_seconds() + KNN_POLL_SECONDS;
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

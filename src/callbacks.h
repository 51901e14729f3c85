/*
 * callbacks.h: the engine's interrupt and progress callbacks, implemented
 * for an R session without ever longjmp-ing through engine frames.
 */
#ifndef KNNGPU_CALLBACKS_H
#define KNNGPU_CALLBACKS_H

#include <Rinternals.h>
#include "knn.h"

typedef struct {
    SEXP bar;     /* cli progress bar, or R_NilValue */
    SEXP caught;  /* list of one: the condition that stopped the engine (an
                     interrupt, or an error such as a time limit), else
                     R_NilValue in it */
    double next_poll; /* knn_seconds() before which the engine's interrupt
                         polls return at once */
} knn_r_session;

/* Starts a cli progress bar (when show is true) and fills cb. The caller
 * protects session->bar and session->caught. */
void knn_r_callbacks(knn_r_session *session, int show, double total,
                     knn_callbacks *cb);

/* Runs body(data), which may raise an R error: returns 0, or nonzero
 * with the error (or an interrupt) kept in session->caught for the glue
 * to raise again once the engine has freed everything. */
int knn_r_catch(knn_r_session *session, SEXP (*body)(void *), void *data);

/* Closes the progress bar, if any. */
void knn_r_callbacks_done(knn_r_session *session);

/* Raises again the condition an interrupt poll caught (session->caught's
 * element): an interrupt as R's own (R/validate.R, .signalInterrupt), an
 * error as it was. Does not return. Call after everything is freed. */
void knn_r_raise(SEXP condition);

/* .Call entry: path (a string) is the file whose appearance, or its
 * directory's removal, stops this process's searches at their next
 * interrupt poll, with an R error; NULL stops watching. Returns NULL. */
SEXP C_knn_stop_file(SEXP path);

#endif

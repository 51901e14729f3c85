.onLoad <- function(libname, pkgname) {
    .state$toldCpu <- FALSE
    invisible(NULL)
}

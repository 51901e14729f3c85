.onLoad <- function(libname, pkgname) {
    .state$toldCpu <- FALSE
    .state$metrics <- .Call(C_knn_metric_table)
    ## The CUDA backend's shared object sits beside the package's own one,
    ## which is opened on the first GPU call (src/engine/knn_gpu_loader.c).
    dll <- getLoadedDLLs()[[pkgname]][["path"]]
    .Call(C_knn_gpu_library,
          file.path(dirname(dll), paste0("knngpu_cuda", .Platform$dynlib.ext)))
    ## KnngpuParam's class and methods are made with BiocNeighbors, whose
    ## load (190 MB) a session that does not use it should not pay; loaded
    ## before or after knngpu, it gets them. A failure to make them is a
    ## message (.registerBiocNeighbors), never a failure to load knngpu.
    setHook(packageEvent("BiocNeighbors", "onLoad"), .registerBiocNeighbors)
    if (isNamespaceLoaded("BiocNeighbors")) .registerBiocNeighbors()
    invisible(NULL)
}

test_that("loading the package maps no CUDA library", {
    skip_on_os(c("windows", "mac"))
    script <- paste0(
        "suppressPackageStartupMessages(library(knngpu));",
        "maps <- readLines('/proc/self/maps');",
        "cat(any(grepl('libcudart|libcublas', maps)))")
    loaded <- system2(file.path(R.home("bin"), "Rscript"),
                      c("-e", shQuote(script)), stdout = TRUE,
                      env = paste0("R_LIBS=", paste(.libPaths(),
                                                    collapse = ":")))
    expect_identical(tail(loaded, 1), "FALSE")
})

## Runs R code in a fresh Rscript with this session's libraries; returns
## its output lines.
rscriptLines <- function(code) {
    suppressWarnings(system2(
        file.path(R.home("bin"), "Rscript"), c("-e", shQuote(code)),
        stdout = TRUE, stderr = TRUE,
        env = paste0("R_LIBS=", paste(.libPaths(), collapse = ":"))))
}

test_that("knngpu and BiocNeighbors' users load in any order", {
    skip_on_os(c("windows", "mac"))
    skip_if_not_installed("BiocNeighbors")
    search <- paste(
        "x <- matrix(rnorm(200 * 4), 200);",
        "got <- BiocNeighbors::findKNN(x, k = 5,",
        "    BNPARAM = KnngpuParam(device = 'cpu'));",
        "ref <- BiocNeighbors::findKNN(x, k = 5,",
        "    BNPARAM = BiocNeighbors::ExhaustiveParam());",
        "cat(identical(got$index, ref$index),",
        "    nrow(knnGraph(x, k = 2, device = 'cpu')))")
    orders <- list(c("BiocNeighbors", "knngpu"), c("knngpu", "BiocNeighbors"),
                   c("bluster", "knngpu"), c("scran", "knngpu"),
                   c("knngpu", "scran"))
    for (packages in orders) {
        if (!all(vapply(packages, requireNamespace, logical(1),
                        quietly = TRUE))) {
            next
        }
        loads <- paste0("suppressPackageStartupMessages(library(",
                        packages, "));", collapse = "")
        out <- rscriptLines(paste(loads, "set.seed(1);", search))
        expect_identical(tail(out, 1), "TRUE 400",
                         label = paste(packages, collapse = " then "))
    }
})

test_that("a failed registration says why and leaves nothing behind", {
    skip_on_os(c("windows", "mac"))
    skip_if_not_installed("BiocNeighbors")
    ## Registration made to fail half way, after some methods were set.
    code <- paste(
        "library(knngpu);",
        "fail <- function(set) {",
        "    set('buildIndex', c(BNPARAM = 'KnngpuParam'),",
        "        function(X, ..., BNPARAM) NULL);",
        "    stop('simulated')",
        "};",
        "assignInNamespace('.bnInterfaces', list(`1` = fail, `2` = fail),",
        "                  'knngpu');",
        "said <- 'nothing';",
        "withCallingHandlers(library(BiocNeighbors), message = function(m) {",
        "    said <<- conditionMessage(m);",
        "    invokeRestart('muffleMessage')",
        "});",
        "left <- grep('Knngpu', names(methods::findMethods(",
        "    BiocNeighbors::buildIndex)), value = TRUE);",
        "param <- tryCatch(KnngpuParam(), error = conditionMessage);",
        "cat(said, param, length(left),",
        "    methods::isClass('KnngpuParam', where = knngpu:::.bnEnv),",
        "    nrow(knnGraph(matrix(rnorm(60), 20), k = 2, device = 'cpu')),",
        "    sep = '\\n')")
    out <- rscriptLines(code)
    expect_match(out[1], "could not register KnngpuParam with BiocNeighbors")
    expect_match(out[1], "simulated")
    expect_match(paste(out, collapse = "\n"),
                 "KnngpuParam\\(\\) is not available: knngpu could not")
    expect_identical(tail(out, 3), c("0", "FALSE", "40"))
})

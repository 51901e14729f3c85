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

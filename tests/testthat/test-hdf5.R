## knnSearch(filepath =) (R/hdf5.R): index and distance written to an HDF5
## file as the blocks come, read back as HDF5Array matrices with the bits
## of the in-memory result.

## expr evaluated with DelayedArray's block size set to `bytes`.
withBlockSize <- function(bytes, expr) {
    old <- DelayedArray::getAutoBlockSize()
    suppressMessages(DelayedArray::setAutoBlockSize(bytes))
    on.exit(suppressMessages(DelayedArray::setAutoBlockSize(old)))
    expr
}

test_that("a result written to HDF5 has the bits of the one in memory", {
    skip_if_not_installed("HDF5Array")
    x <- tiedMatrix(300, 9, 71)
    q <- tiedMatrix(45, 9, 72)
    for (metric in c("pearson", "euclidean", "cosine")) {
        for (k in c(1L, 6L)) {
            label <- sprintf("%s k=%d", metric, k)
            whole <- knnSearch(x, k = k, metric = metric, device = "cpu")
            near <- knnSearch(x, q, k = k, metric = metric, device = "cpu")
            ## 40 nodes a block: several blocks, the last one shorter.
            file <- tempfile(fileext = ".h5")
            got <- withBlockSize(40 * 20 * k, knnSearch(
                x, k = k, metric = metric, device = "cpu", filepath = file))
            expect_s4_class(got$index, "HDF5Matrix")
            expect_identical(attr(got, "timings")$blocks, 8L, label = label)
            expect_identical(as.matrix(got$index), whole$index,
                             label = label)
            expect_identical(as.matrix(got$distance), whole$distance,
                             label = label)
            ## The file alone holds the result.
            expect_identical(as.matrix(HDF5Array::HDF5Array(file, "index")),
                             whole$index, label = label)
            file <- tempfile(fileext = ".h5")
            got <- withBlockSize(7 * 20 * k, knnSearch(
                x, q, k = k, metric = metric, device = "cpu",
                filepath = file))
            expect_identical(as.matrix(got$index), near$index, label = label)
            expect_identical(as.matrix(got$distance), near$distance,
                             label = label)
        }
    }
    ## One block when the result fits in the block size.
    got <- knnSearch(x, k = 4, device = "cpu", filepath = tempfile())
    expect_identical(attr(got, "timings")$blocks, 1L)
    expect_identical(as.matrix(got$distance),
                     knnSearch(x, k = 4, device = "cpu")$distance)
})

test_that("workers' blocks are written to HDF5 with the same bits", {
    skip_if_not_installed("HDF5Array")
    skip_if_not_installed("BiocParallel")
    skip_on_os("windows")
    x <- tiedMatrix(260, 7, 73)
    whole <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu")
    dir <- tempfile("checkpoint")
    for (run in 1:2) {
        file <- tempfile(fileext = ".h5")
        got <- knnSearch(x, k = 5, metric = "euclidean", device = "cpu",
                         BPPARAM = BiocParallel::SnowParam(2, tasks = 3),
                         checkpoint = dir, filepath = file)
        expect_identical(as.matrix(got$index), whole$index)
        expect_identical(as.matrix(got$distance), whole$distance)
        ## The second run reads the checkpoint's blocks into the file.
        expect_identical(attr(got, "timings")$resumed, if (run == 2) 3L
                                                       else 0L)
    }
    unlink(dir, recursive = TRUE)
})

test_that("'filepath' is checked, and no file is left by a failed search", {
    skip_if_not_installed("HDF5Array")
    x <- tiedMatrix(120, 6, 74)
    file <- tempfile(fileext = ".h5")
    file.create(file)
    expect_error(knnSearch(x, k = 3, filepath = file),
                 "'filepath' names a file that exists already")
    expect_error(knnSearch(x, k = 3, filepath = c("a.h5", "b.h5")),
                 "'filepath' must be NULL or the path of an HDF5 file")
    ## A block whose search fails (here the engine refuses a constant node
    ## for Pearson) removes the file begun for the result.
    x[100, ] <- 1
    file <- tempfile(fileext = ".h5")
    expect_error(withBlockSize(30 * 20 * 3, knnSearch(
        x, k = 3, metric = "pearson", device = "cpu", filepath = file)),
        "constant")
    expect_false(file.exists(file))
})

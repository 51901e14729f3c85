## The data shapes where exact search falls off cliffs, generated here (no
## download): used by inst/bench/shapes.R at full size and by the tests
## (tests/testthat/setup.R, through system.file()) at small size.
##
##   normal     N(0,1)
##   levels     genes at lognormal levels (linear scale, meanlog 6, sdlog
##              1.5: from about 10 to 40000) times 1 + 3 shared factors
##              (loadings N(0, 0.2)) plus 5% noise
##   logcounts  log1p of Poisson counts, rates from 8 cell types (most
##              near 0.2: about 80% zeros), 10% of the rows duplicated
##   neardup    N(0,1) rows, each repeated 4 times with noise of sd 1e-7
##              (clusters of near-duplicates)
##   clusters   copies of 20 N(0,1) profiles, each moved by noise of sd
##              1e-4 (replicates of a few states): neighbours differ by
##              some 1e-7 of the norms, which float32 cannot resolve
##   pca        PCA-like scores: N(0,1) columns of standard deviation
##              20 * 0.85^(j - 1) (variances falling steeply, as PCs do)
##   cellpcs    clustered PCs: 12 cell types, their centres and the cells
##              around them both on the falling PC scales
##   heavy      Student t values with 3 degrees of freedom (outliers)
##   binary     presence data: Bernoulli(0.2)
##   duplicates a quarter of the rows, each exactly 4 times, shuffled
##   replicates exact copies of 20 profiles (few distinct points)
## Rows the correlations cannot use (constant, all zero) get a 1 first.

shapeFeatures <- c(normal = 50, levels = 100, logcounts = 500, neardup = 50,
                   clusters = 50, pca = 50, cellpcs = 50, heavy = 50,
                   binary = 100, duplicates = 50, replicates = 50)

shapeData <- function(kind, n, p = shapeFeatures[[kind]], seed = 20261123) {
    set.seed(seed)
    x <- switch(kind,
        normal = matrix(rnorm(n * p), n),
        levels = {
            level <- rlnorm(n, meanlog = 6, sdlog = 1.5)
            factors <- matrix(rnorm(3 * p), 3)
            loadings <- matrix(rnorm(n * 3, sd = 0.2), n)
            level * (1 + loadings %*% factors +
                     matrix(rnorm(n * p, sd = 0.05), n))
        },
        logcounts = {
            markers <- min(60, p %/% 2)
            type <- sample(8, n, replace = TRUE)
            rate <- matrix(0.2, 8, p)
            for (t in 1:8) rate[t, sample(p, markers)] <- runif(markers, 1, 20)
            x <- log1p(matrix(rpois(n * p, rate[type, ]), n))
            copies <- sample(n, n %/% 10)
            x[copies, ] <- x[sample(n, length(copies)), ]
            x
        },
        neardup = {
            base <- matrix(rnorm(n %/% 4 * p), n %/% 4)
            base[rep(seq_len(nrow(base)), each = 4), ] +
                matrix(rnorm(n %/% 4 * 4 * p, sd = 1e-7), n %/% 4 * 4)
        },
        clusters = {
            profiles <- matrix(rnorm(20 * p), 20)
            profiles[rep_len(1:20, n), ] + matrix(rnorm(n * p, sd = 1e-4), n)
        },
        pca = matrix(rnorm(n * p), n) %*% diag(20 * 0.85^(seq_len(p) - 1),
                                               p),
        cellpcs = {
            scale <- diag(0.85^(seq_len(p) - 1), p)
            centres <- matrix(rnorm(12 * p, sd = 20), 12) %*% scale
            centres[sample(12, n, replace = TRUE), ] +
                matrix(rnorm(n * p, sd = 3), n) %*% scale
        },
        heavy = matrix(rt(n * p, df = 3), n),
        binary = matrix(rbinom(n * p, 1, 0.2), n),
        duplicates = {
            base <- matrix(rnorm(ceiling(n / 4) * p), ceiling(n / 4))
            base[sample(rep_len(seq_len(nrow(base)), n)), ]
        },
        replicates = matrix(rnorm(20 * p), 20)[sample(20, n, TRUE), ])
    flat <- apply(x, 1L, function(r) all(r == r[1L]))
    x[flat, 1L] <- x[flat, 1L] + 1
    x
}

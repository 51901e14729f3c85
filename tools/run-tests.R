## Runs the whole test suite against the installed package and ends with
## one "tests: N passed, N failed, N skipped" line; exits 1 on any failure.
## With an argument, runs only the test files whose names match it (a
## regular expression, as testthat's filter), and a skip fails too: the
## caller runs those files where their conditions hold (.ci/run runs
## "slurm" inside tools/slurm-local.sh).
filter <- commandArgs(trailingOnly = TRUE)[1L]
results <- as.data.frame(testthat::test_local(
    "tests/testthat", filter = if (!is.na(filter)) filter,
    load_package = "installed", reporter = "summary",
    stop_on_failure = FALSE))
failed <- sum(results$failed) + sum(results$error)
skipped <- sum(results$skipped)
passed <- sum(results$nb) - sum(results$failed) - sum(results$skipped)
cat(sprintf("tests: %d passed, %d failed, %d skipped\n", passed, failed,
            skipped))
quit(status = if (failed > 0 || (!is.na(filter) && skipped > 0)) 1L else 0L)

## The --name=value arguments of the scripts in tools/ (sourced by them,
## from the repository root).
args <- commandArgs(trailingOnly = TRUE)

## The value of --name=, else `default` (a string).
argValue <- function(name, default) {
    hit <- grep(paste0("^--", name, "="), args, value = TRUE)
    if (length(hit)) sub(paste0("^--", name, "="), "", hit[1L]) else default
}

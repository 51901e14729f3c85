library(testthat)
library(knngpu)

test_check("knngpu")

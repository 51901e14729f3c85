# Developer shortcuts (listed in .Rbuildignore). Builds run from a fresh
# tarball in a temporary folder, so several builds never share object files.
LIB ?= $(CURDIR)/.lib
R ?= R

.PHONY: doc install test check bench-cpu clean

doc:
	Rscript -e 'roxygen2::roxygenise(load_code = "source")'

install:
	mkdir -p $(LIB)
	tmp=$$(mktemp -d) && cd $$tmp && \
	$(R) CMD build --no-build-vignettes --no-manual $(CURDIR) >/dev/null && \
	$(R) CMD INSTALL --library=$(LIB) knngpu_*.tar.gz && rm -rf $$tmp

test: install
	R_LIBS=$(LIB) Rscript -e 'testthat::test_local("tests/testthat", load_package = "installed", reporter = "summary", stop_on_failure = TRUE)'

check:
	tmp=$$(mktemp -d) && cd $$tmp && $(R) CMD build $(CURDIR) && \
	_R_CHECK_FORCE_SUGGESTS_=false $(R) CMD check --no-manual knngpu_*.tar.gz

bench-cpu: install
	R_LIBS=$(LIB) Rscript inst/bench/cpu.R

clean:
	./cleanup
	rm -rf $(LIB)

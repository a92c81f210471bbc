# Two commands do all set-up: `make run` and `make test`. Both create .venv when it is missing and
# reinstall only when pyproject.toml or uv.lock changed (the stamp file below). They install the
# releases uv.lock holds (the tested set; `make lock` updates it): uv exports it as constraints,
# so every package gpuflow needs gets its locked release, and torch, where TORCH_PIN pins the CPU
# build, is left out of them. uv installs (53 s against pip's 117 s on a fresh clone here): it is
# given pip's PIP_FIND_LINKS, PIP_INDEX_URL and PIP_EXTRA_INDEX_URL (which it does not read),
# picks the best version over all of them as pip does, and compiles the bytecode as pip does
# (where PYTHONDONTWRITEBYTECODE is set, nothing else would).
PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
LOCKED := $(VENV)/locked.txt
# The uv that wrote uv.lock (its format) and installs from it; `make lock` uses the same.
UV_VERSION := 0.13.9
LOCK_ARGS ?=
CORES ?= 2
WHEELHOUSE ?=
WHEEL_PYTHON ?= 3.11
WHEEL_SKIP ?=
# Extra gpu-check arguments (`python -m benchmarks.gpu_check --help`), e.g.
# GPU_CHECK="--sections scaling ssvae --skip-compile".
GPU_CHECK ?=
# Machines without an NVIDIA driver get the CPU build of torch that lies on local disk.
TORCH_PIN := $(if $(shell command -v nvidia-smi 2>/dev/null),,torch==2.13.0)

UV_SOURCES := $(foreach link,$(PIP_FIND_LINKS),--find-links $(link)) \
	$(if $(PIP_INDEX_URL),--index-url $(PIP_INDEX_URL)) \
	$(foreach url,$(PIP_EXTRA_INDEX_URL),--extra-index-url $(url))

export PATH := $(BIN):$(PATH)

# The tiny configs in .test/<name>/config.yaml (the tests use them) are linted and dry-run too.
TEST_CONFIGS := $(wildcard .test/*/config.yaml)

.PHONY: run test lint dry-runs config-doc gpu-check gpu-pilot install lock wheelhouse clean

install: $(STAMP)

# WHEELHOUSE=DIR (a GPU node with no registry; see `make wheelhouse`): .venv is made afresh with
# PYTHON, sees PYTHON's own packages (its CUDA torch: a .pth file names PYTHON's site-packages
# and user site, which also works where PYTHON is itself a venv) and installs DIR's wheels and
# gpuflow without resolving: on an H100 node (2026-11-27) pip did not count the torch it sees
# through that file and stopped with "No matching distribution found for torch>=2.4".
$(STAMP): pyproject.toml uv.lock
ifeq ($(WHEELHOUSE),)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip uv==$(UV_VERSION)
	$(VENV)/bin/uv export --quiet --locked --no-emit-project --extra dev --no-header \
		--no-annotate $(if $(TORCH_PIN),--no-emit-package torch) --output-file $(LOCKED)
	$(VENV)/bin/uv pip install --quiet --python $(VENV)/bin/python --compile-bytecode \
		--index-strategy unsafe-best-match $(UV_SOURCES) --constraints $(LOCKED) \
		$(TORCH_PIN) -e '.[dev]'
else
	$(PYTHON) -m venv --clear $(VENV)
	$(PYTHON) -c 'import site; print(*site.getsitepackages(), site.getusersitepackages(), sep="\n")' \
		> $$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/node-python.pth
	$(VENV)/bin/python -m pip install --quiet --no-index --no-deps $(WHEELHOUSE)/*.whl
	$(VENV)/bin/python -m pip install --quiet --no-index --no-deps --no-build-isolation -e .
	$(VENV)/bin/python -c 'import gpuflow.cli, snakemake, torch, transformers'
endif
	touch $(STAMP)

# uv.lock again after pyproject.toml's dependencies changed, keeping every other locked release;
# LOCK_ARGS=--upgrade takes the newest release each range allows, --upgrade-package NAME one
# package's. Resolved for every platform and Python >= 3.11 from PyPI alone (torch's PyPI build:
# CUDA on Linux), so the lock names no file of this machine.
lock:
	test -x $(VENV)/bin/uv || { $(PYTHON) -m venv $(VENV) && \
		$(VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION); }
	$(VENV)/bin/uv lock $(LOCK_ARGS)

# Wheels of all gpuflow needs but torch, for a GPU node without a registry (run on the login
# node): WHEEL_PYTHON is the node's Python, WHEEL_SKIP names packages it already has.
wheelhouse: $(STAMP)
	python scripts/wheelhouse.py --dest wheelhouse --python-version $(WHEEL_PYTHON) \
		$(if $(WHEEL_SKIP),--skip $(WHEEL_SKIP))

run: $(STAMP)
	snakemake --cores $(CORES)
	snakemake --cores $(CORES) --report results/report.html

# One pytest worker per core and two more (tests/conftest.py groups them: the live-SLURM tests
# run in two groups on two workers, sharing one cluster; each other module stays on one worker
# with its fixtures). The live-SLURM workers mostly wait on SLURM (time limits, requeues,
# polls); the extra workers use that time.
TEST_WORKERS ?= $(shell echo $$(( $(CORES) + 2 )))
test: $(STAMP)
	pytest -n $(TEST_WORKERS)

# Every CUDA path at paper sizes against references (tiny sizes on CPU): results/gpu_check.json.
# A GPU test suite outside the package (benchmarks/gpu_check/), run from the repository root.
gpu-check: $(STAMP)
	python -m benchmarks.gpu_check --out results/gpu_check.json --record-dir benchmarks/records $(GPU_CHECK)

# On a GPU node: calibrate the node, plan one job per GPU family at paper sizes (config/pilot.yaml),
# run them and print predicted against measured; the rates and the comparison go to
# benchmarks/records/ (about 12 minutes on one H100 node: its calibration alone took 6.5).
gpu-pilot: $(STAMP)
	python benchmarks/plan_accuracy.py --configfile config/pilot.yaml --folder results/pilot \
		--cores $(CORES) --save-records

lint: $(STAMP)
	ruff check .
	ruff format --check .
	lint-imports
	snakefmt --check Snakefile workflow
	snakemake --lint
	set -e; for config in $(TEST_CONFIGS); do \
		echo "snakemake --lint --configfile $$config"; \
		snakemake --lint --configfile $$config; \
	done

# Each .test config plans in a fresh folder (nothing of results/ or .snakemake/ is touched).
dry-runs: $(STAMP)
	set -e; for config in $(TEST_CONFIGS); do \
		echo "snakemake --dry-run --configfile $$config"; \
		workdir=$$(mktemp -d); \
		snakemake --quiet --dry-run --snakefile $(CURDIR)/Snakefile --directory $$workdir \
			--configfile $(CURDIR)/$$config; \
		rm -rf $$workdir; \
	done

config-doc: $(STAMP)
	gpuflow config-doc

clean:
	rm -rf results .snakemake

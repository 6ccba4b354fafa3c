# pdserve: make demo | make test | make build | make bench-engine
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
DEMO_MODEL ?= models/demo-qwen3-tiny

.PHONY: deps configure build test demo bench-engine format clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@test -f $(BUILD_DIR)/build.ninja || cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The demo: make the default model if missing, generate once offline, then start a colocated
# server in the background (on a free port), drive it with a short `pdserve bench`, print the
# report and stop the server (also on failure or Ctrl-C).
DEMO_BENCH_FLAGS ?= --dataset-name sharegpt-like --length-scale 0.05 --num-prompts 32 --request-rate 8 \
	--ignore-eos --goodput ttft:500 tpot:100 --metric-percentiles 50,90,99
demo: build
	@test -f $(DEMO_MODEL)/config.json || $(BUILD_DIR)/pdserve make-model --arch qwen3 --preset tiny --dtype bf16 --seed 1 --out $(DEMO_MODEL)
	@echo "demo: offline generation (random weights: the text is noise; token ids and logprobs show the engine at work)"
	$(BUILD_DIR)/pdserve generate --model $(DEMO_MODEL) --prompt "Hello world, this is a test" --max-tokens 16 --ignore-eos --json
	@set -e; log=$$(mktemp); \
	$(BUILD_DIR)/pdserve serve --model $(DEMO_MODEL) --served-model-name demo --port 0 > $$log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null || true; wait $$pid 2>/dev/null || true; rm -f $$log' EXIT INT TERM; \
	port=; for i in $$(seq 1 600); do \
	  port=$$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' $$log | head -n 1); \
	  [ -n "$$port" ] && break; \
	  kill -0 $$pid 2>/dev/null || break; sleep 0.1; \
	done; \
	if [ -z "$$port" ]; then echo "demo: the server did not start:"; cat $$log; exit 1; fi; \
	echo "demo: server on port $$port; running pdserve bench $(DEMO_BENCH_FLAGS)"; \
	$(BUILD_DIR)/pdserve bench --base-url http://127.0.0.1:$$port $(DEMO_BENCH_FLAGS)

bench-engine: build
	$(BUILD_DIR)/pdserve bench-engine

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR)

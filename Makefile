# pdserve: make demo | make test | make build | make asan | make tsan | make fuzz | make bench-disagg | make bench-engine
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
DEMO_MODEL ?= models/demo-llama

.PHONY: deps configure build test demo asan tsan fuzz bench-disagg bench-engine format clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@test -f $(BUILD_DIR)/build.ninja || cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The whole suite, after clang's thread-safety analysis over the tree (syntax only, a few minutes).
test: build
	scripts/check-thread-safety.sh $(BUILD_DIR) $(JOBS)
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# The transfer, messenger and server tests under AddressSanitizer (with LeakSanitizer) or
# ThreadSanitizer, in a clang build of their own (build-asan/, build-tsan/).
SAN_TESTS = transfer_tests messenger_tests server_tests
SAN_LABELS = ^(transfer_tests|messenger_tests|server_tests)$$
asan tsan: deps
	@test -f build-$@/build.ninja || cmake -S . -B build-$@ -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DPD_SANITIZE=$(if $(filter asan,$@),address,thread)
	cmake --build build-$@ -j $(JOBS) --target $(SAN_TESTS)
	cd build-$@ && TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp" \
	  ctest -L '$(SAN_LABELS)' --output-on-failure -j $(JOBS) --timeout 900

# The parsers under libFuzzer (fuzz/README.md): a clang build of its own (build-fuzz/, PD_FUZZ=ON,
# AddressSanitizer + UndefinedBehaviorSanitizer) regenerates the generated seeds in fuzz/corpus/,
# then runs each target for FUZZ_SECONDS (one at a time, one process each) and reports its
# executions and coverage. FUZZ_TARGETS picks some: make fuzz FUZZ_TARGETS=wire FUZZ_SECONDS=60.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?= wire openai_request model_config safetensors tokenizer
fuzz: deps
	@test -f build-fuzz/build.ninja || cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DPD_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS) --target fuzz_seed_corpus $(addsuffix _fuzz,$(FUZZ_TARGETS))
	build-fuzz/fuzz/fuzz_seed_corpus fuzz/corpus
	fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The demo: builds pdserve alone, generates once offline with the shipped model (models/demo-llama,
# a small Llama trained on Debian's fortune cookies by tools/train_demo_model.py), then runs the
# same chat-like `pdserve bench` workload on `pdserve up` (1 prefill + 1 decode instance, each
# pinned to its own core) and on a colocated `pdserve serve` using both cores, prints the two
# reports side by side and ends with a chat completion generated through `up`, prefill -> decode,
# and the paths of its pictures (SLO attainment against rate for each deployment, latency CDFs,
# one request's timeline; bench/plot.py) beside its results
# (bench/disagg/run.sh --scenario demo; every server is stopped on exit, failure or Ctrl-C).
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target pdserve
	@echo "demo: offline generation (pdserve generate, greedy)"
	$(BUILD_DIR)/pdserve generate --model $(DEMO_MODEL) --prompt "The secret of life is" --max-tokens 40
	bench/disagg/run.sh --scenario demo --model $(DEMO_MODEL) --pdserve $(BUILD_DIR)/pdserve

# Disaggregated against colocated: the demo's chat workload, the TTFT added at low load, and p99
# ITL when prefills arrive during decodes (a few minutes; see README "Disaggregated vs colocated").
bench-disagg: build
	bench/disagg/run.sh --model $(DEMO_MODEL) --pdserve $(BUILD_DIR)/pdserve

bench-engine: build
	$(BUILD_DIR)/pdserve bench-engine

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz

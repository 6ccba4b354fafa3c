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

demo: build
	@test -f $(DEMO_MODEL)/config.json || $(BUILD_DIR)/pdserve make-model --arch qwen3 --preset tiny --dtype bf16 --seed 1 --out $(DEMO_MODEL)
	$(BUILD_DIR)/pdserve generate --model $(DEMO_MODEL) --prompt "The quick brown fox" --max-tokens 24 --ignore-eos

bench-engine: build
	$(BUILD_DIR)/pdserve bench-engine

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR)

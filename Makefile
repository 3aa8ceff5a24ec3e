# Thin wrapper over scripts/setup (packages + build) and the built `tachyon` binary.
BUILD_DIR ?= build
TACHYON := $(BUILD_DIR)/tachyon
DEMO_MODEL ?= $(firstword $(wildcard models/tachyon-demo/config.json) $(wildcard ../shared/models/stories260K/stories260K.bin))
DEMO_PROMPT ?= func (b *Buffer) Len() int {
DEMO_FLAGS ?= -n 96 --temp 0.7 --top-p 0.9 --repeat-penalty 1.1 --seed 42

.PHONY: demo test build clean sanitize

# Everything: the binary, the tests and the benchmarks.
build:
	BUILD_DIR=$(BUILD_DIR) scripts/setup

# The demo needs the binary alone.
demo:
	BUILD_DIR=$(BUILD_DIR) TARGETS=tachyon scripts/setup
	@if [ -z "$(DEMO_MODEL)" ]; then echo "no bundled model found (models/tachyon-demo)"; exit 1; fi
	$(TACHYON) generate -m $(dir $(DEMO_MODEL)) -p '$(DEMO_PROMPT)' $(DEMO_FLAGS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $$(nproc) --timeout 600

# ASan + UBSan build of the CPU project in build-sanitize/, then the test suite under it.
sanitize:
	scripts/sanitize

clean:
	rm -rf $(BUILD_DIR)

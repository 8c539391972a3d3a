# lora-stack: one non-recursive Makefile.
#   make                 build every program into $(BUILD)/bin, and the tests and benchmarks
#   make bins            the programs alone
#   make test            build, then run unit, cli and end-to-end tests
#   make deps            install missing Debian packages (as root) or print the command
#   make demo            start the stack on the demo model, query it, stop it
#   make bench           build and run the benchmarks in tests/bench (bench-peers, bench-7b
#                        included)
#   make bench-7b        the 7B shape (15 GB of bf16, written once into build/peers/cache):
#                        load, resident memory and decode in bfloat16 and int8
#   make bench-peers     lora-stack's CPU decode beside llama.cpp and PyTorch (tests/bench/peers;
#                        BENCH_PEERS_ARGS=--quick for a pipeline check on a tiny model)
#   make bench-deps      install what only the benchmarks need (node-llama-cpp into build/peers)
#   make install         programs and manual pages under PREFIX (default /usr/local)
#   make SANITIZE=address,undefined test    the same under sanitizers (separate build dir)
#   make fuzz [FUZZ_SECONDS=N]  build the libFuzzer targets of tests/fuzz with clang (ASan,
#                        UBSan) into build/fuzz and run each for N seconds (default 10)
#   make CUDA=auto|0|1   build the CUDA kernels: auto = when nvcc is found

CC       ?= gcc
NVCC     ?= nvcc
CUDA     ?= auto
SANITIZE ?=
PYTHON   ?= /usr/bin/python3

ifeq ($(CUDA),auto)
CUDA_ON := $(if $(shell command -v $(NVCC) 2>/dev/null),1,0)
else ifeq ($(CUDA),1)
CUDA_ON := 1
else ifeq ($(CUDA),0)
CUDA_ON := 0
else
$(error CUDA must be auto, 0 or 1, not '$(CUDA)')
endif

BUILD ?= build/$(if $(SANITIZE),san,main)$(if $(filter 1,$(CUDA_ON)),-cuda,)
$(info lora-stack: CUDA=$(CUDA) -> $(if $(filter 1,$(CUDA_ON)),cuda kernels on,cpu only); build dir $(BUILD))

WARN := -Wall -Wextra -Wshadow -Wvla -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes \
        -Wformat=2 -Wundef -Wcast-align -Wwrite-strings -Wno-unused-parameter -Wno-missing-field-initializers
CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_GNU_SOURCE -march=x86-64-v2 $(WARN) -MMD -MP -Ilib -I.
# The CPU backend alone is built for AVX2+FMA(+F16C, its f16 conversions) and threaded with
# OpenMP: nothing else depends on either (docs/design.md, "Layers").
CPU_BACKEND_CFLAGS := -mavx2 -mfma -mf16c -fopenmp
LDLIBS += -lopenblas -ljansson -lmsgpackc -lzmq -lmicrohttpd -lpcre2-8 -lutf8proc -lm -lpthread
LDFLAGS += -fopenmp
# lora-bench alone speaks HTTP as a client: libcurl, through pkg-config, for it only.
CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
CURL_LIBS   := $(or $(shell pkg-config --libs libcurl 2>/dev/null),-lcurl)
ifneq ($(SANITIZE),)
CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=$(SANITIZE)
endif

NVCCFLAGS ?= -O2 -std=c++20 -Ilib -I.
# SASS for the A100 (sm_80), A10 (sm_86), L4 (sm_89), H100 and H200 (sm_90), and PTX of sm_90 for
# anything newer, which the driver compiles at first load.
NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 \
                -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90,code=[sm_90,compute_90]
ifeq ($(CUDA_ON),1)
# nvcc may be a wrapper script on the PATH: ask it where its own runtime libraries are.
ifeq ($(origin CUDA_LIBDIR),undefined)
CUDA_LIBDIR := $(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | \
                 sed -n 's/^\#\$$ LIBRARIES=//p' | grep -o '"-L[^"]*"' | grep -v stubs | tail -n 1 | \
                 tr -d '"' | cut -c3-)
endif
ifeq ($(CUDA_LIBDIR),)
$(error unable to find the CUDA runtime libraries through '$(NVCC) --dryrun'; set CUDA_LIBDIR)
endif
CFLAGS += -DLORA_CUDA=1
# cudart is linked statically; cuBLAS and NCCL are opened with dlopen when a CUDA backend (a
# tensor-parallel group) first needs them, looked for first in this toolkit (backend/cuda/libs_cuda.h).
NVCCFLAGS += $(NVCC_GENCODE) -Xcompiler -Wall,-Wextra,-Wno-unused-parameter \
             -DLORA_CUDA_LIBDIR=\"$(CUDA_LIBDIR)\"
LDLIBS += -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
endif

PROGRAMS := $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard cmd/*/*.c)))))
SCRIPT_SRC := $(wildcard cmd/*/*.sh)
LIB_SRC  := $(wildcard lib/*/*.c) $(wildcard backend/*.c) $(wildcard backend/cpu/*.c) \
            $(wildcard backend/ref/*.c)
CUDA_SRC := $(if $(filter 1,$(CUDA_ON)),$(wildcard backend/cuda/*.cu))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CUDA_SRC:%.cu=$(BUILD)/%.cu.o)
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNITS    := $(UNIT_SRC:%.c=$(BUILD)/%)
# tests/backend: every backend against backend/ref, through the interface alone (no fixtures).
BACKEND_TEST_SRC := $(wildcard tests/backend/test_*.c)
BACKEND_TESTS := $(BACKEND_TEST_SRC:%.c=$(BUILD)/%)
FIXTURE_OBJ := $(BUILD)/tests/unit/fixture.o
# tests/backend/test_cuda also runs against the CUDA backend compiled with the host C++ compiler
# over a CPU emulation of CUDA (backend/cuda/emu), in every build: its kernels and host code are
# checked on machines without a GPU. The emulated objects come before the library at the link,
# so they replace its backend.o (and its CUDA objects in a CUDA build).
CXX      ?= g++
EMU_DIR  := $(BUILD)/emu
EMU_CXXFLAGS := -O2 -g -std=c++20 -D_GNU_SOURCE -DLORA_CUDA=1 -DLORA_CUDA_EMU=1 -Wall -Wextra \
                -Wno-unused-parameter -Wno-missing-field-initializers -MMD -MP -Ilib -I.
EMU_OBJ  := $(patsubst backend/cuda/%.cu,$(EMU_DIR)/backend/cuda/%.o,$(wildcard backend/cuda/*.cu)) \
            $(EMU_DIR)/backend/cuda/emu/cuda_emu.o $(EMU_DIR)/backend/backend.o
CUDA_EMU_TEST := $(BUILD)/tests/backend/test_cuda_emu
# lora-worker on that emulation: the end-to-end tests run `--device cuda` ranks with it.
CUDA_EMU_WORKER := $(BUILD)/tests/bin/lora-worker-emu
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCHES  := $(BENCH_SRC:%.c=$(BUILD)/%)
TOOL_SRC := $(wildcard tests/tools/*.c)
TOOLS    := $(TOOL_SRC:%.c=$(BUILD)/%)
BINS     := $(PROGRAMS:%=$(BUILD)/bin/%) $(patsubst %.sh,$(BUILD)/bin/%,$(notdir $(SCRIPT_SRC)))

DEB_PACKAGES := build-essential pkg-config libmsgpack-dev libzmq3-dev libjansson-dev \
                libopenblas-dev libmicrohttpd-dev libpcre2-dev libutf8proc-dev bats python3 \
                python3-numpy python3-msgpack python3-zmq curl jq groff-base python3-yaml \
                python3-jsonschema prometheus clang libcurl4-openssl-dev gnuplot-nox

.DELETE_ON_ERROR:
.SECONDARY:
.PHONY: all bins deps test demo bench bench-7b bench-deps bench-peers clean format install fuzz fuzz-build
.DEFAULT_GOAL := all

all: $(BINS) $(UNITS) $(BACKEND_TESTS) $(CUDA_EMU_TEST) $(CUDA_EMU_WORKER) $(BENCHES) $(TOOLS)
# The programs alone: what the demo runs.
bins: $(BINS)

# Made afresh each time: an object whose source was moved or removed must not linger in it.
$(BUILD)/liblora.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/backend/cpu/%.o: backend/cpu/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPU_BACKEND_CFLAGS) -c $< -o $@

# Also threaded: the synthetic-model writer (chunks of random weights in parallel) and the
# benchmarks, which measure the machine's bandwidth and FMA peak with the backend's own flags.
$(BUILD)/lib/runtime/synthetic.o: CFLAGS += -fopenmp
# and lora_quantize_i8 (backend/dtype.c), which spreads a tensor's rows over threads.
$(BUILD)/backend/dtype.o: CFLAGS += -fopenmp
$(BUILD)/tests/bench/%.o: CFLAGS += $(CPU_BACKEND_CFLAGS)
# The e^x test calls the backend's vector code directly.
$(BUILD)/tests/unit/test_exp_cpu.o: CFLAGS += $(CPU_BACKEND_CFLAGS)

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# The CUDA files without device code (all but kernels_cuda.cu) need no code for every
# architecture: one pass instead of five halves the CUDA build.
$(patsubst %.cu,$(BUILD)/%.cu.o,$(filter-out backend/cuda/kernels_cuda.cu,$(CUDA_SRC))): \
    NVCC_GENCODE = -gencode arch=compute_80,code=sm_80

$(EMU_DIR)/backend/cuda/%.o: backend/cuda/%.cu
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(EMU_DIR)/backend/cuda/emu/%.o: backend/cuda/emu/%.cc
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_DIR)/backend/backend.o: backend/backend.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -DLORA_CUDA=1 -DLORA_CUDA_EMU=1 -c $< -o $@

$(CUDA_EMU_TEST): $(BUILD)/tests/backend/test_cuda.o $(EMU_OBJ) $(BUILD)/liblora.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lstdc++ -o $@

# Scripts (cmd/<name>/<name>.sh) are programs too: copied, executable.
define script_rule
$(BUILD)/bin/$(basename $(notdir $(1))): $(1)
	@mkdir -p $$(@D)
	install -m 0755 $$< $$@
endef
$(foreach f,$(SCRIPT_SRC),$(eval $(call script_rule,$(f))))

# One generic link rule: a program is every object of cmd/<name>/ plus the library.
prog_objs = $(patsubst %.c,$(BUILD)/%.o,$(wildcard cmd/$(1)/*.c))
.SECONDEXPANSION:
$(BUILD)/bin/%: $$(call prog_objs,$$*) $(BUILD)/liblora.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(CUDA_EMU_WORKER): $(call prog_objs,lora-worker) $(EMU_OBJ) $(BUILD)/liblora.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lstdc++ -o $@

# lora-bench: libcurl for its client, libdl to open NVML at run time when it is there.
$(BUILD)/cmd/lora-bench/%.o: CFLAGS += $(CURL_CFLAGS)
$(BUILD)/bin/lora-bench: LDLIBS += $(CURL_LIBS) -ldl

# A unit test also links the shared fixtures of tests/unit/fixture.c; a backend test, a bench or
# a test tool (tests/tools/: small drivers the end-to-end tests call), the library only.
$(UNITS): $(BUILD)/tests/unit/test_%: $(BUILD)/tests/unit/test_%.o $(FIXTURE_OBJ) $(BUILD)/liblora.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/liblora.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "lora-stack: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
	  echo "lora-stack: missing packages; run: sudo apt-get install -y$$missing" >&2; exit 1; \
	fi

test: deps
	@$(MAKE) --no-print-directory all
	@LORA_BUILD=$(BUILD) PYTHON=$(PYTHON) tests/run

# The demo: the whole stack on the demo model, two completions, the adapters as the exporter and
# the inspector report them, then down (examples/demo.sh; DEMO_PORT / DEMO_METRICS_PORT). Its
# build takes every core unless make was given a -j of its own.
DEMO_PORT ?= 8000
DEMO_METRICS_PORT ?= 9100
demo: deps
	@$(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc)) bins
	@examples/demo.sh $(BUILD)/bin $(DEMO_PORT) $(DEMO_METRICS_PORT)

bench: deps
	@$(MAKE) --no-print-directory all
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done
	@echo "== tests/bench/protocol_share.py"; $(PYTHON) tests/bench/protocol_share.py --bin $(BUILD)/bin
	@echo "== tests/bench/frontend_overhead.py"; OMP_WAIT_POLICY=passive $(PYTHON) tests/bench/frontend_overhead.py --bin $(BUILD)/bin
	@echo "== tests/bench/metrics_scrape.py"; $(PYTHON) tests/bench/metrics_scrape.py --bin $(BUILD)/bin
	@$(MAKE) --no-print-directory bench-peers
	@$(MAKE) --no-print-directory bench-7b

# One process per precision: both 7B models at once (15.2 + 8.6 GB) do not fit in 24 GiB, and
# the one evicted would be timed reading its weights back from disk.
bench-7b: deps
	@$(MAKE) --no-print-directory all
	@echo "== tests/bench/peers/make_model.sh 7b"
	@LORA_BIN=$(BUILD)/bin sh tests/bench/peers/make_model.sh 7b
	@for p in bfloat16 int8; do \
	  echo "== bench_model --model build/peers/cache/7b --precisions $$p"; \
	  $(BUILD)/tests/bench/bench_model --model build/peers/cache/7b --only decode \
	    --precisions $$p --rounds 2 || exit 1; \
	done

# Packages only the benchmarks use, never the tests: Debian's numpy and PyTorch for the Python
# peers, and llama.cpp's prebuilt CPU build from npm (node-llama-cpp and its linux-x64 binaries,
# the versions pinned by tests/bench/peers/package-lock.json) installed into build/peers; the
# benchmark downloads nothing when it runs. node-llama-cpp needs Node.js 20 or later.
BENCH_DEB_PACKAGES := python3-numpy python3-torch
PEERS_DIR := build/peers
bench-deps:
	@missing=""; for p in $(BENCH_DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "lora-stack: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing || exit 1; \
	  else \
	    echo "lora-stack: missing packages; run: sudo apt-get install -y$$missing" >&2; exit 1; \
	  fi; \
	fi
	@node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null || \
	  { echo "lora-stack: bench-peers needs Node.js 20 or later with npm" >&2; exit 1; }
	@if ! cmp -s tests/bench/peers/package-lock.json $(PEERS_DIR)/package-lock.json || \
	    [ ! -f $(PEERS_DIR)/node_modules/@node-llama-cpp/linux-x64/package.json ]; then \
	  mkdir -p $(PEERS_DIR) && \
	  cp tests/bench/peers/package.json tests/bench/peers/package-lock.json $(PEERS_DIR)/ && \
	  echo "lora-stack: npm install into $(PEERS_DIR)" && \
	  NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --prefix $(PEERS_DIR) --omit=optional --ignore-scripts \
	    --no-audit --no-fund --loglevel=error; \
	fi

# lora-stack beside llama.cpp and PyTorch (tests/bench/peers/run.py): prepares the 0.5B-shape
# model, GGUFs and adapters once in build/peers/cache, checks greedy agreement, times.
BENCH_PEERS_ARGS ?=
bench-peers: deps bench-deps
	@$(MAKE) --no-print-directory $(BUILD)/bin/lora-worker
	@echo "== tests/bench/peers/run.py $(BENCH_PEERS_ARGS)"
	@$(PYTHON) tests/bench/peers/run.py --bin $(BUILD)/bin $(BENCH_PEERS_ARGS)

# Fuzzing: every decoder of untrusted input has a libFuzzer target in tests/fuzz/fuzz_*.c, with
# a small seed corpus in tests/fuzz/corpus/<target>/. The library is compiled again with clang
# under AddressSanitizer and UndefinedBehaviorSanitizer into build/fuzz (CUDA off). A target that
# needs a program's own parsing functions links that program's objects but main.c, and stands in
# for what needs a live peer.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 10
FUZZ_BUILD   := build/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_PLAIN   := -O1 -g -std=c11 -D_GNU_SOURCE -march=x86-64-v2 -mavx2 -mfma -mf16c -fopenmp $(WARN) \
                -Wno-format-nonliteral -Wno-string-concatenation -Wno-cast-align \
                -MMD -MP -Ilib -I. -Itests/fuzz
FUZZ_CFLAGS  := $(FUZZ_PLAIN) $(FUZZ_SAN) -fsanitize=fuzzer-no-link
FUZZ_SRC     := $(filter-out tests/fuzz/fuzz_util.c,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_LIB_OBJ := $(patsubst %.c,$(FUZZ_BUILD)/%.o,$(filter-out backend/cuda/%,$(LIB_SRC)))
# The matmul and attention kernels parse no input, so sanitizers add nothing there; instrumented,
# their unrolled tiles take clang minutes to compile, so they are built plain.
$(patsubst %.c,$(FUZZ_BUILD)/%.o,$(wildcard backend/cpu/matmul*.c) backend/cpu/attention_cpu.c): \
  FUZZ_CFLAGS := $(FUZZ_PLAIN)
# fuzz_http links the frontend's routing and parsing: cmd/lora-frontend but main.c and link.c.
FUZZ_FRONTEND_SRC := $(filter-out cmd/lora-frontend/main.c cmd/lora-frontend/link.c, \
                     $(wildcard cmd/lora-frontend/*.c))
FUZZ_FRONTEND_OBJ := $(FUZZ_FRONTEND_SRC:%.c=$(FUZZ_BUILD)/%.o)

$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_BUILD)/liblora.a: $(FUZZ_LIB_OBJ)
	rm -f $@
	$(AR) rcs $@ $^

$(FUZZ_BUILD)/fuzz_http: $(FUZZ_FRONTEND_OBJ)
$(FUZZ_TARGETS): $(FUZZ_BUILD)/%: $(FUZZ_BUILD)/tests/fuzz/%.o \
                 $(FUZZ_BUILD)/tests/fuzz/fuzz_util.o $(FUZZ_BUILD)/liblora.a
	$(FUZZ_CC) -fopenmp $(FUZZ_SAN) -fsanitize=fuzzer $(filter %.o,$^) $(FUZZ_BUILD)/liblora.a \
	    $(LDLIBS) -o $@

fuzz-build: $(FUZZ_TARGETS)

# make fuzz FUZZ_SECONDS=N [FUZZ_RUNS=N] [FUZZ_TARGET=name]: each target for N seconds (or N
# executions; FUZZ_SECONDS=0 lifts the time limit) on a copy of its seed corpus
# (build/fuzz/corpus), one line of executions per target; a crash fails with its input kept in
# build/fuzz/ (turn it into a unit test).
fuzz: fuzz-build
	@FUZZ_RUNS=$(FUZZ_RUNS) tests/fuzz/run $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGET)

# make install PREFIX=/opt/lora-stack [DESTDIR=...]: the programs and the manual pages.
PREFIX ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	    $(DESTDIR)$(PREFIX)/share/man/man7
	install -m 0755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(wildcard man/*.1) $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 $(wildcard man/*.7) $(DESTDIR)$(PREFIX)/share/man/man7/

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf build

-include $(wildcard $(FUZZ_BUILD)/lib/*/*.d $(FUZZ_BUILD)/backend/*.d $(FUZZ_BUILD)/backend/*/*.d \
    $(FUZZ_BUILD)/cmd/*/*.d $(FUZZ_BUILD)/tests/fuzz/*.d)
-include $(LIB_OBJ:.o=.d) $(EMU_OBJ:.o=.d) $(UNITS:=.d) $(BACKEND_TESTS:=.d) $(FIXTURE_OBJ:.o=.d) $(BENCHES:=.d) \
    $(TOOLS:=.d) $(patsubst %.c,$(BUILD)/%.d,$(wildcard cmd/*/*.c))

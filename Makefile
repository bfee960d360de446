# Ingot entry points. `make demo` and `make test` each install what is missing, build, then run.
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
APT_PACKAGES := cmake ninja-build g++ libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev \
                libgtest-dev libpcre2-dev fortunes python3 python3-pip
PIP_PACKAGES := tokenizers==0.22.1

.PHONY: all deps build demo test bench clean

all: build

# Install only what is missing, so a prepared machine pays nothing.
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@python3 -c "import tokenizers" 2>/dev/null || python3 -m pip install -q $(PIP_PACKAGES) 2>/dev/null \
	  || python3 -m pip install -q --user --break-system-packages $(PIP_PACKAGES) \
	  || echo "warning: could not install the Python 'tokenizers' package; tokenizer parity tests will skip"

$(BUILD)/build.ninja: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	bash tools/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest -LE cuda --output-on-failure -j $(JOBS); status=$$?; \
	  bash $(CURDIR)/tools/show_skips.sh .; exit $$status

bench: build
	bash bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)

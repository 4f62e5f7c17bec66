# llama_tool.sh: sourced by the scripts here. `llama_tool NAME SRC_DIR BUILD_DIR` compiles
# $HERE/NAME.cc (a small program on llama.cpp's C API: greedy_ids, llama_quantize) against the
# llama.cpp source tree SRC_DIR (for llama.h, ggml.h) and its build BUILD_DIR (libllama, libggml)
# into BUILD_DIR/bin/NAME when missing or older than its source, and prints that path.
llama_tool() {
  local name="$1" src="$2" build="$3"
  local bin="$build/bin/$name"
  if [[ ! -x "$bin" || "$HERE/$name.cc" -nt "$bin" ]]; then
    nice -n 19 g++ -O2 -std=c++17 -o "$bin" "$HERE/$name.cc" -I"$src/include" \
      -I"$src/ggml/include" -L"$build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$build/bin" >&2
  fi
  echo "$bin"
}

// llamacpp_tokenize: llama.cpp's own tokenizer on a GGUF file's vocabulary, driven over stdin, so
// that make_goldens.py can record what llama.cpp makes of each text. Built against the libllama of
// a llama.cpp build (make_goldens.py compiles it); not part of the modserve build.
//
//   llamacpp_tokenize MODEL.gguf ADD_SPACE_PREFIX(0|1) < requests > answers
// Requests, one per line; texts travel hex-encoded:
//   E <add_special 0|1> <hex text>  ->  "<id>,<id>,..."   (llama_tokenize with parse_special)
//   D <skip_special 0|1> <id,id,..> ->  "<hex text>"       (see Detokenize below)
// Before the answers, one line: "info <n_tokens> <bos> <eos> <add_bos> <add_eos> <special ids>",
// special ids being those llama.cpp renders only when asked to (control and unknown types).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::strtol(hex.substr(i, 2).c_str(), nullptr, 16)));
  }
  return out;
}

std::string ToHex(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

// llama_detokenize's composition of pieces (the leading space of the first piece dropped when the
// vocabulary adds a space prefix, BOS/EOS removed when skipping special tokens) without its
// clean-up of spaces before punctuation, which modserve does not do: the result is what a stream
// of llama_token_to_piece calls shows.
std::string Detokenize(const llama_vocab* vocab, std::vector<llama_token> ids, bool skip,
                       bool add_space_prefix) {
  bool remove_space = add_space_prefix;
  size_t begin = 0, end = ids.size();
  if (skip && llama_vocab_get_add_bos(vocab) && end > 0 && ids[0] == llama_vocab_bos(vocab)) {
    remove_space = false;
    ++begin;
  }
  if (skip && llama_vocab_get_add_eos(vocab) && end > begin &&
      ids[end - 1] == llama_vocab_eos(vocab)) {
    --end;
  }
  std::string text;
  for (size_t i = begin; i < end; ++i) {
    std::vector<char> buf(64);
    int n = llama_token_to_piece(vocab, ids[i], buf.data(), buf.size(), remove_space, !skip);
    if (n < 0) {
      buf.resize(-n);
      n = llama_token_to_piece(vocab, ids[i], buf.data(), buf.size(), remove_space, !skip);
    }
    remove_space = false;
    text.append(buf.data(), n);
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf ADD_SPACE_PREFIX < requests\n", argv[0]);
    return 2;
  }
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const bool add_space_prefix = std::atoi(argv[2]) != 0;
  const int n_tokens = llama_vocab_n_tokens(vocab);

  std::printf("info %d %d %d %d %d", n_tokens, llama_vocab_bos(vocab), llama_vocab_eos(vocab),
              llama_vocab_get_add_bos(vocab), llama_vocab_get_add_eos(vocab));
  std::string sep = " ";
  for (llama_token t = 0; t < n_tokens; ++t) {
    if (llama_vocab_get_attr(vocab, t) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN)) {
      std::printf("%s%d", sep.c_str(), t);
      sep = ",";
    }
  }
  std::printf("\n");

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op, flag, arg;
    in >> op >> flag >> arg;
    if (op == "E") {
      const std::string text = FromHex(arg);
      std::vector<llama_token> ids(text.size() + 8);
      int n = llama_tokenize(vocab, text.data(), text.size(), ids.data(), ids.size(), flag == "1",
                             /*parse_special=*/true);
      if (n < 0) {
        ids.resize(-n);
        n = llama_tokenize(vocab, text.data(), text.size(), ids.data(), ids.size(), flag == "1",
                           true);
      }
      for (int i = 0; i < n; ++i) std::printf(i ? ",%d" : "%d", ids[i]);
      std::printf("\n");
    } else if (op == "D") {
      std::vector<llama_token> ids;
      std::stringstream ss(arg);
      std::string part;
      while (std::getline(ss, part, ',')) ids.push_back(std::atoi(part.c_str()));
      std::printf("%s\n", ToHex(Detokenize(vocab, ids, flag == "1", add_space_prefix)).c_str());
    } else {
      std::fprintf(stderr, "bad request: %s\n", line.c_str());
      return 2;
    }
    std::fflush(stdout);
  }
  llama_model_free(model);
  llama_backend_free();
  return 0;
}

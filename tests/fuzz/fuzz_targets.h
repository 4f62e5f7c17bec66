// The fuzz targets: one function per parser, each taking arbitrary bytes and checking the parser's
// documented contract on them. The same functions back the libFuzzer binaries (fuzz_main.cc) and
// the corpus replay test (regressions_test.cc); they hold no state between calls except the
// tokenizers and the demo model's config, loaded once.
#ifndef MODSERVE_TESTS_FUZZ_FUZZ_TARGETS_H_
#define MODSERVE_TESTS_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace modserve::fuzz {

// Every target returns 0 (libFuzzer's "keep going") and aborts through FUZZ_CHECK, with the
// violated property printed, when the code under test breaks its contract. Memory errors are
// the sanitizers' business.
using FuzzFn = int (*)(const uint8_t* data, size_t size);

// The bytes are a whole safetensors file, opened with Checkpoint::OpenFile from an in-memory
// file (memfd). On success every tensor must lie inside the file, not overlap another, have
// bytes == numel * element size, and be readable end to end through Get().
int FuzzCheckpoint(const uint8_t* data, size_t size);

// The bytes are a whole GGUF file, opened with GgufFile::Open from an in-memory file. A rejection
// must be DataLoss naming the file. An accepted file must match the header as the specification
// reads it from the raw bytes (magic, version, counts), every typed getter must succeed or fail
// with InvalidArgument naming the key, and every tensor must lie inside the file, aligned, with
// bytes == blocks * block size, no two overlapping, readable end to end. LoadTokenizerFromGguf
// must then give no tokenizer (NotFound), InvalidArgument naming the file, or a tokenizer that
// encodes a sample to ids naming tokens and decodes them to valid UTF-8. LoadModel on the same
// file must then either bind a model (config rules kept, one LayerWeights per layer, tied exactly
// when output.weight is absent) or fail with InvalidArgument or DataLoss naming the file.
int FuzzGguf(const uint8_t* data, size_t size);

// The bytes are a config.json, parsed with ParseConfig. On success the result must satisfy
// every rule config.h states (ranges, divisibility, routed layers, predictor presence); on
// failure the code must be InvalidArgument and the message start with "config.json: ".
int FuzzConfig(const uint8_t* data, size_t size);

// The bytes are a tokenizer.json for LoadBpeTokenizerFromJson. A loaded tokenizer must
// encode and decode a fixed sample without failing, with every id inside its vocabulary.
int FuzzBpeJson(const uint8_t* data, size_t size);

// First byte: which tokenizer (even: the demo byte-level BPE, odd: the SentencePiece test model)
// and flags; the rest is text to encode. Valid UTF-8 must encode (ids in range) and decode to
// valid UTF-8; for the byte-level BPE, Decode(Encode(text)) == text. Invalid UTF-8 must give
// InvalidArgument.
int FuzzTokenizerEncode(const uint8_t* data, size_t size);

// First byte: tokenizer and flags; the rest is little-endian int32 ids (some mapped into the
// vocabulary, some left wild). Decode succeeds iff every id names a token, and its text is valid
// UTF-8; a failure is InvalidArgument.
int FuzzTokenizerDecode(const uint8_t* data, size_t size);

// First byte: tokenizer and flags; then a stream of (chunk length, ids...) records fed to an
// IncrementalDetokenizer. The concatenation of every Add() and the final Flush() must equal
// Decode(all accepted ids); every piece must be valid UTF-8; a rejected chunk must be
// InvalidArgument and leave the stream as it was.
int FuzzDetokenizer(const uint8_t* data, size_t size);

// First byte: flags (1: the rest is [u16 LE n][n bytes of GenerateRequest][prompt text], the text
// replacing the input; 2: no tokenizer; 4: the demo config with max_seq_len 64; 8: no deadline);
// otherwise the rest is a serialized modserve.v1.GenerateRequest, given to server::ToLoopRequest
// with the demo model's config and tokenizer. An oracle written from the proto's field comments
// lists the invalid fields: a rejection must be InvalidArgument naming one of them (or OutOfRange
// naming max_new_tokens and max_seq_len when only the length is wrong; Internal only when the
// tokenizer itself failed); an accepted request must have none, fit the context, carry every
// field over unchanged (or its default), have prompt and stop ids in the vocabulary and pass
// engine::Validate.
int FuzzRequest(const uint8_t* data, size_t size);

// First byte: flags (1: chat instead of completions; 2: no tokenizer; 4: the demo config with
// max_seq_len 64; 8: no chat template; 16: --max_prompt_tokens=8 --max_new_tokens=8); the rest
// is an HTTP request body for server::ParseOpenAiRequest with the demo model and SmolLM2's chat
// template. A refusal must be InvalidArgument / NotFound / FailedPrecondition naming a field
// ("top_p: ...", "messages[1].content: ..."), OutOfRange naming the limit, ResourceExhausted (the
// template's bounds) or Internal (the tokenizer's), and its ErrorJson must be OpenAI's error
// object carrying the message; an accepted request must be within every limit, in the
// vocabulary, and pass engine::Validate.
int FuzzOpenAiRequest(const uint8_t* data, size_t size);

// The bytes are a Jinja template for server::jinja::Template::Parse; one that parses is rendered
// with a fixed chat context under small RenderLimits. Parse errors are InvalidArgument naming
// the template line; a render is valid UTF-8 within the output limit, or fails with
// InvalidArgument or ResourceExhausted.
int FuzzJinja(const uint8_t* data, size_t size);

// Byte 0: limits (bit 0: a small body and header limit; otherwise the server's defaults); bytes
// 1-2: a split point; the rest is one connection's input for server::ParseHttpRequests, the
// HTTP port's own framing (its Beast parser settings and refusals). Accepted requests must be
// within every limit (body, request line + headers), with token method and header names, no CR /
// LF / NUL in values, and a body as long as its Content-Length; a request that closes the
// connection must be the last read; a refusal must be 400 / 413 / 431 naming its limit, with
// the error object the server sends; and the bytes arriving in two reads split at that point
// must give exactly what they give in one.
int FuzzHttpRequest(const uint8_t* data, size_t size);

// Name -> function, for the replay test and for fuzz_main.cc. nullptr for an unknown name.
FuzzFn FindTarget(std::string_view name);

}  // namespace modserve::fuzz

#endif  // MODSERVE_TESTS_FUZZ_FUZZ_TARGETS_H_

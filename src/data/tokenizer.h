#pragma once
// Tokenizers: raw UTF-8 bytes (vocabulary 256) or a SentencePiece model (BPE or unigram).
// A prepared data directory describes its tokenizer in tokenizer.json:
//   {"type": "bytes" | "sentencepiece", "vocab_size": N, "model": "tokenizer.model"}
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loco {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int vocab_size() const = 0;
  // Token that separates documents, or -1.
  virtual int32_t eos_id() const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path);
// A SentencePiece model from its serialized bytes (`source` names it in messages).
std::unique_ptr<Tokenizer> sentencepiece_from_bytes(const std::string& model_bytes, const std::string& source);
// Loads DIR/tokenizer.json (and its model file).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

struct SentencePieceOptions {
  int vocab_size = 4096;
  std::string model_type = "bpe";  // or "unigram"
  int64_t max_sentences = 2000000;  // sentences sampled for training (bounds memory)
  uint64_t seed = 0;
};
// Trains on the given UTF-8 text files (one sentence per line) and writes DIR/tokenizer.model.
void train_sentencepiece(const std::vector<std::string>& files, const std::string& out_dir,
                         const SentencePieceOptions& options);

// Returns the byte offset (relative to `data`; negative if it starts in `carry`) of the first
// invalid UTF-8 sequence, if any. For streamed input, an incomplete sequence at the
// end is moved to `carry` and checked with the next chunk; a non-empty carry at the end of
// the stream is itself an error.
std::optional<int64_t> find_invalid_utf8(const char* data, size_t n, std::string& carry);

}  // namespace loco

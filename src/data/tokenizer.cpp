#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/sp_model_check.h"
#include "core/fs.h"

namespace loco {

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) s.push_back(char(id & 0xff));
    return s;
  }
  int vocab_size() const override { return 256; }
  int32_t eos_id() const override { return -1; }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model_bytes, const std::string& source) {
    sentencepiece::util::Status st;
    try {  // SentencePiece's trie builder throws on some malformed models (an empty piece)
      st = sp_.LoadFromSerializedProto(model_bytes);
    } catch (const std::exception& e) {
      fail(source + ": cannot load SentencePiece model: " + e.what());
    }
    if (!st.ok()) fail(source + ": cannot load SentencePiece model: " + st.ToString());
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    if (!st.ok()) fail("SentencePiece encode failed: " + st.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    const auto st = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
    if (!st.ok()) fail("SentencePiece decode failed: " + st.ToString());
    return out;
  }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path) {
  return sentencepiece_from_bytes(read_file(model_path), model_path);
}

std::unique_ptr<Tokenizer> sentencepiece_from_bytes(const std::string& model_bytes, const std::string& source) {
  check_sentencepiece_model(model_bytes, source);
  return std::make_unique<SentencePieceTokenizer>(model_bytes, source);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  const nlohmann::json j = read_json_file(path);
  const std::string type = j.value("type", "");
  if (type == "bytes") return make_byte_tokenizer();
  if (type == "sentencepiece") return load_sentencepiece(dir + "/" + j.value("model", "tokenizer.model"));
  fail(path + ": \"type\" must be \"bytes\" or \"sentencepiece\"");
}

void train_sentencepiece(const std::vector<std::string>& files, const std::string& out_dir,
                         const SentencePieceOptions& o) {
  check(!files.empty(), "no input files to train the tokenizer on");
  std::string input;
  for (const auto& f : files) input += (input.empty() ? "" : ",") + f;
  // Fixed special ids: unk 0, bos 1, eos 2 (documents are separated by eos); byte fallback so
  // that any text can be encoded; one thread so the model is deterministic.
  const std::string args = "--input=" + input + " --model_prefix=" + out_dir + "/tokenizer" +
                           " --vocab_size=" + std::to_string(o.vocab_size) + " --model_type=" + o.model_type +
                           " --character_coverage=1.0 --byte_fallback=true --unk_id=0 --bos_id=1 --eos_id=2"
                           " --pad_id=-1 --num_threads=1 --input_sentence_size=" +
                           std::to_string(o.max_sentences) + " --shuffle_input_sentence=true --minloglevel=2";
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(o.seed));
  // The trainer logs its whole command line to stderr before parsing --minloglevel; keep the
  // user's terminal clean (failures come back in the status).
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved >= 0 && null_fd >= 0) ::dup2(null_fd, STDERR_FILENO);
  const auto st = sentencepiece::SentencePieceTrainer::Train(args);
  std::fflush(stderr);
  if (saved >= 0) {
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
  }
  if (null_fd >= 0) ::close(null_fd);
  if (!st.ok()) {
    // Too little text for the vocabulary: say so in the option's terms, with the trainer's limit.
    std::smatch m;
    const std::string msg = st.ToString();
    if (std::regex_search(msg, m, std::regex(R"(Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+))")))
      fail("--vocab-size " + m[1].str() + " is more than SentencePiece can make of this text (at most " + m[2].str() +
           "): give more text" + (std::stol(m[2].str()) >= 300 ? ", or a smaller --vocab-size" : ", or --tokenizer bytes"));
    fail("SentencePiece training failed: " + msg);
  }
}

std::optional<int64_t> find_invalid_utf8(const char* data, size_t n, std::string& carry) {
  // Validate carry + data as one stream; report offsets relative to `data`.
  std::string joined;
  const char* p = data;
  size_t len = n;
  const int64_t shift = int64_t(carry.size());
  if (!carry.empty()) {
    joined = carry + std::string(data, n);
    p = joined.data();
    len = joined.size();
    carry.clear();
  }
  size_t i = 0;
  while (i < len) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    int extra;
    uint32_t min_cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      min_cp = 0x10000;
    } else {
      return int64_t(i) - shift;
    }
    if (i + size_t(extra) >= len) {  // incomplete at the end: keep it for the next chunk
      carry.assign(p + i, len - i);
      return std::nullopt;
    }
    uint32_t cp = c & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(p[i + k]);
      if ((cc & 0xC0) != 0x80) return int64_t(i) - shift;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return int64_t(i) - shift;
    i += size_t(extra) + 1;
  }
  return std::nullopt;
}

}  // namespace loco

#include "data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "data/text_input.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "core/fs.h"

namespace loco {

namespace fs = std::filesystem;

namespace {

bool has_extension(const fs::path& p, const std::vector<std::string>& extensions) {
  fs::path name = p.filename();
  if (name.extension() == ".gz") name = name.stem();
  const std::string ext = name.extension().string();
  if (ext.size() < 2) return false;
  return std::find(extensions.begin(), extensions.end(), ext.substr(1)) != extensions.end();
}

}  // namespace

std::string describe_extensions(const std::vector<std::string>& extensions) {
  std::string text;
  for (const auto& e : extensions) text += (text.empty() ? "." : ", .") + e;
  return text;
}

std::vector<std::string> list_input_files(const std::vector<std::string>& inputs,
                                          const std::vector<std::string>& extensions,
                                          std::vector<std::string>* skipped) {
  check(!inputs.empty(), "--input: no input files given");
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found, passed;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const bool hidden = !name.empty() && name[0] == '.';
        if (it->is_directory()) {
          if (hidden) {
            passed.push_back(it->path().string() + "/");
            it.disable_recursion_pending();
          }
        } else if (it->is_regular_file()) {
          (!hidden && has_extension(it->path(), extensions) ? found : passed).push_back(it->path().string());
        }
      }
      if (ec) fail(in + ": cannot read directory: " + ec.message());
      std::sort(found.begin(), found.end());
      std::sort(passed.begin(), passed.end());
      if (skipped) skipped->insert(skipped->end(), passed.begin(), passed.end());
      if (found.empty())
        fail(in + ": directory has no files to read (" + describe_extensions(extensions) + ", not hidden" +
             (passed.empty() ? "" : "; " + std::to_string(passed.size()) + " others skipped, e.g. " + passed.front()) +
             "); name files directly or choose --extensions");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else if (fs::exists(in, ec)) {
      fail(in + ": not a regular file or a directory");
    } else {
      fail(in + ": no such file or directory");
    }
  }
  return files;
}

static double entropy_of_counts(const std::vector<int64_t>& counts) {
  double n = 0, h = 0;
  for (int64_t c : counts) n += double(c);
  for (int64_t c : counts)
    if (c > 0) h -= double(c) / n * std::log(double(c) / n);
  return h;
}

double unigram_entropy(const std::vector<int32_t>& tokens) {
  // Counted up to the largest token present: a model's vocabulary (2e9 entries is a valid
  // config) may be far larger than its data's.
  const int32_t top = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  std::vector<int64_t> counts(size_t(top) + 1, 0);
  for (int32_t t : tokens) ++counts[size_t(t)];
  return entropy_of_counts(counts);
}

namespace {

// The split: text goes in whole blocks of consecutive lines, JSON Lines in whole documents, each
// block or document to validation by a seeded hash. When that holds out nothing (a small
// input), the last lines are validation instead: at least one, about val_fraction of them.
struct Split {
  const PrepareOptions& o;
  bool by_document = false;
  int64_t tail_from = -1;  // >= 0: lines from this index on are validation
  bool hashed(int64_t document, int64_t line_index) const {
    const uint64_t unit = by_document ? uint64_t(document) : uint64_t(line_index / o.block_lines);
    Rng r(mix_seed(o.seed, unit, by_document ? 0xd0c5 : 0x5a17));
    return r.uniform() < o.val_fraction;
  }
  bool validation(int64_t document, int64_t line_index) const {
    return tail_from >= 0 ? line_index >= tail_from : hashed(document, line_index);
  }
};

}  // namespace

PrepareSummary prepare_data(const PrepareOptions& options) {
  PrepareOptions o = options;
  if (o.vocab_size == 0) o.vocab_size = o.tokenizer == "bytes" ? 256 : 4096;
  check(!o.out_dir.empty(), "--out is required");
  check(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1)");
  check(o.block_lines >= 1, "block size must be >= 1 line");
  check(o.tokenizer == "bytes" || o.tokenizer == "sentencepiece",
        "--tokenizer must be bytes or sentencepiece, got " + o.tokenizer);
  check(o.model_type == "bpe" || o.model_type == "unigram", "--model-type must be bpe or unigram");
  PrepareSummary sum;
  const auto files = list_input_files(o.inputs, o.extensions, &sum.skipped);
  Split split{o};
  split.by_document = std::all_of(files.begin(), files.end(), [&](const std::string& f) { return is_jsonl_input(f, o.input); });
  sum.files = int64_t(files.size());
  make_dirs(o.out_dir);

  // Pass 1: validate UTF-8; for SentencePiece, collect the training split's lines into one
  // temporary file (the trainer samples at most max_sentences of them, bounding memory).
  const std::string spm_input = o.out_dir + "/.tokenizer-train.txt";
  std::unique_ptr<std::ofstream> spm_out;
  if (o.tokenizer == "sentencepiece") spm_out = std::make_unique<std::ofstream>(spm_input, std::ios::binary);
  int64_t lines = 0, hashed_val = 0, text_lines = 0;
  sum.bytes = for_each_input_line(files, o.input, true, [&](int64_t doc, std::string& line, int64_t index) {
    const bool val = split.hashed(doc, index);
    hashed_val += val;
    lines = index + 1;
    text_lines += !line.empty();
    if (spm_out && !line.empty() && !val) *spm_out << line << '\n';
  });
  if (text_lines == 0) {
    if (spm_out) spm_out->close(), std::filesystem::remove(spm_input);
    fail("--input holds no text (" + std::to_string(files.size()) + " file(s), " +
         (lines == 0 ? std::string("empty") : std::to_string(lines) + " line(s), all empty") + ")");
  }
  if (o.val_fraction > 0 && hashed_val == 0 && lines > 1) {
    // The tokenizer saw these lines too: harmless for a tokenizer, and the model never trains on them.
    split.tail_from = lines - std::max<int64_t>(1, int64_t(std::ceil(o.val_fraction * double(lines))));
    sum.val_tail = true;
  }

  std::unique_ptr<Tokenizer> tok;
  nlohmann::json meta;
  if (o.tokenizer == "bytes") {
    if (o.vocab_size != 256)
      fail("--vocab-size must be 256 with the bytes tokenizer, got " + std::to_string(o.vocab_size));
    tok = make_byte_tokenizer();
    meta = {{"type", "bytes"}, {"vocab_size", 256}};
  } else {
    spm_out->close();
    check(o.vocab_size >= 300, "--vocab-size must be >= 300 for SentencePiece (256 byte pieces + specials)");
    try {
      train_sentencepiece({spm_input}, o.out_dir, {o.vocab_size, o.model_type, 2000000, o.seed});
    } catch (...) {
      std::filesystem::remove(spm_input);
      throw;
    }
    std::filesystem::remove(spm_input);
    tok = load_sentencepiece(o.out_dir + "/tokenizer.model");
    meta = {{"type", "sentencepiece"}, {"vocab_size", tok->vocab_size()}, {"model", "tokenizer.model"},
            {"model_type", o.model_type}};
  }
  sum.vocab_size = tok->vocab_size();

  // Pass 2: encode into the two token files; each document (a text file, a JSON Lines record)
  // ends with eos if the tokenizer has one, in the split its last line went to.
  TokenFileWriter train(o.out_dir + "/train.tok", uint64_t(sum.vocab_size));
  TokenFileWriter val(o.out_dir + "/val.tok", uint64_t(sum.vocab_size));
  std::vector<int64_t> counts(size_t(sum.vocab_size), 0);
  auto emit = [&](TokenFileWriter& dst, const std::vector<int32_t>& ids) {
    dst.append(ids.data(), ids.size());
    if (&dst == &train)
      for (int32_t id : ids) ++counts[size_t(id)];
  };
  TokenFileWriter* last = &train;
  int64_t current_doc = 0;
  int64_t line_index = 0;
  for_each_input_line(files, o.input, false, [&](int64_t doc, std::string& line, int64_t index) {
    if (doc != current_doc && tok->eos_id() >= 0) emit(*last, {tok->eos_id()});
    current_doc = doc;
    TokenFileWriter& dst = split.validation(doc, index) ? val : train;
    if (o.tokenizer == "bytes") line.push_back('\n');
    emit(dst, tok->encode(line));
    last = &dst;
    line_index = index + 1;
  });
  if (tok->eos_id() >= 0) emit(*last, {tok->eos_id()});
  sum.lines = line_index;
  sum.train_tokens = int64_t(train.count());
  sum.val_tokens = int64_t(val.count());
  check(sum.train_tokens > 0, "the inputs produced no training tokens");
  train.finish();
  val.finish();
  sum.unigram_entropy = entropy_of_counts(counts);
  meta["train_tokens"] = sum.train_tokens;
  meta["val_tokens"] = sum.val_tokens;
  meta["unigram_entropy_nats"] = sum.unigram_entropy;
  meta["source_files"] = sum.files;
  meta["source_bytes"] = sum.bytes;
  write_file_atomic(o.out_dir + "/tokenizer.json", meta.dump(2) + "\n");
  return sum;
}

}  // namespace loco

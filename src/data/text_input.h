#pragma once
// The text inputs of `loco data prepare`: plain UTF-8 files, JSON Lines files holding one
// document per line in a string field, either of them gzip-compressed.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loco {

struct TextInputOptions {
  // auto: a file whose name ends in .jsonl (before an optional .gz) is JSON Lines, any other
  // is text; text or jsonl: every input is read so.
  std::string format = "auto";
  std::string jsonl_field = "text";  // the string field of each JSON Lines record
};

// True when `path` is read as JSON Lines under `o`.
bool is_jsonl_input(const std::string& path, const TextInputOptions& o);

// Calls fn(document, line, line_index) for every line of every document, streaming and in
// order. A text file is one document; a JSON Lines record is one, its text split at '\n'.
// Gzip-compressed files (recognised by their magic bytes) are decompressed on the fly. With
// `validate`, fails naming the file and position of the first invalid UTF-8, malformed or
// truncated gzip stream, line that is not a JSON object, or record without the string field.
// Returns the bytes of text read (decompressed; for JSON Lines, the documents' text).
int64_t for_each_input_line(const std::vector<std::string>& files, const TextInputOptions& o, bool validate,
                            const std::function<void(int64_t document, std::string& line, int64_t line_index)>& fn);

}  // namespace loco

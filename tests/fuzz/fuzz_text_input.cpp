// Inputs of `loco data prepare`: text and JSON Lines, plain or gzip (the first byte chooses the
// format, the rest is the file as it would be on disk).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "data/text_input.h"
#include "fuzz_common.h"

namespace {
std::string temp_path() {
  static const std::string p = "/tmp/loco_fuzz_text_input." + std::to_string(::getpid());
  return p;
}
}  // namespace

LOCO_FUZZ_TARGET({
  if (input.empty()) return 0;
  loco::TextInputOptions o;
  o.format = (input[0] & 1) ? "jsonl" : "text";
  const std::string path = temp_path();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(input.data() + 1, 1, input.size() - 1, f);
  std::fclose(f);
  size_t lines = 0;
  loco::for_each_input_line({path}, o, true, [&](int64_t, std::string& line, int64_t) { lines += line.size() + 1; });
})

// LOCOTOKS token files, and the data loader over what they hold.
#include <memory>

#include "data/loader.h"
#include "data/token_file.h"
#include "fuzz_common.h"

LOCO_FUZZ_TARGET({
  auto tf = loco::parse_token_file(input, "fuzz.tok");
  if (tf.tokens.size() < 9) return 0;
  auto tokens = std::make_shared<const std::vector<int32_t>>(std::move(tf.tokens));
  loco::DataLoader loader(tokens, 4, 2, 0, 1, 7);
  std::vector<int32_t> in, tg;
  for (int i = 0; i < 3; ++i) loader.next(in, tg);
})

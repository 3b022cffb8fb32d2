// Tokenizer files: a SentencePiece model (serialized by loco data prepare, or by anyone), used
// to encode and decode, ids out of range included.
#include "data/tokenizer.h"
#include "fuzz_common.h"

LOCO_FUZZ_TARGET({
  const auto tok = loco::sentencepiece_from_bytes(input, "fuzz/tokenizer.model");
  const auto ids = tok->encode("The jury said it did find that many of Georgia's registration laws are outmoded.");
  tok->decode(ids);
  tok->decode({0, 1, 2, tok->vocab_size() - 1, tok->vocab_size(), -1});
})

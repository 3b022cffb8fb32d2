#pragma once
// A SentencePiece model (tokenizer.model) may come from anywhere. SentencePiece 0.1.97 (Debian 12)
// trusts the normalization tables inside it: a corrupt "precompiled_charsmap" makes its
// normalizer read outside the table while encoding (found by fuzzing; tests/fuzz). loco checks
// those tables before loading a model.
#include <string>

namespace loco {

// Fails, naming `source`, unless every precompiled_charsmap in the serialized model (the
// normalizer's and the denormalizer's) is well formed: a double-array trie whose every
// reachable lookup stays inside it and whose every value points inside a NUL-terminated table
// of replacement strings.
void check_sentencepiece_model(const std::string& model_bytes, const std::string& source);

}  // namespace loco

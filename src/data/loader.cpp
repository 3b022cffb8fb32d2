#include "data/loader.h"

#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace loco {

DataLoader::DataLoader(std::shared_ptr<const std::vector<int32_t>> tokens, int seq_len, int batch, int replica,
                       int replicas, uint64_t seed)
    : tokens_(std::move(tokens)), seq_(seq_len), batch_(batch), replica_(replica), replicas_(replicas), seed_(seed) {
  check(seq_ >= 1 && batch_ >= 1, "data: sequence length and batch size must be >= 1");
  check(replicas_ >= 1 && replica_ >= 0 && replica_ < replicas_, "data: replica index out of range");
  windows_ = tokens_->size() > 0 ? int64_t(tokens_->size() - 1) / seq_ : 0;
  per_replica_ = windows_ / replicas_;
  if (per_replica_ < batch_)
    fail("data: the training file has " + std::to_string(tokens_->size()) + " tokens = " + std::to_string(windows_) +
         " windows of " + std::to_string(seq_) + ", fewer than " + std::to_string(replicas_) + " replicas x batch " +
         std::to_string(batch_));
}

void DataLoader::build_permutation(int64_t epoch) {
  perm_.resize(size_t(windows_));
  std::iota(perm_.begin(), perm_.end(), int64_t(0));
  Rng rng(mix_seed(seed_, uint64_t(epoch), 0xda7a));
  for (int64_t i = windows_ - 1; i > 0; --i) {
    const int64_t j = int64_t(rng.next_u64() % uint64_t(i + 1));
    std::swap(perm_[size_t(i)], perm_[size_t(j)]);
  }
  perm_epoch_ = epoch;
}

int64_t DataLoader::next_window() {
  if (pos_.taken >= rows_in_epoch()) {
    ++pos_.epoch;
    pos_.taken = 0;
    pos_.offset = 0;
  }
  if (perm_epoch_ != pos_.epoch) build_permutation(pos_.epoch);
  const int64_t w = perm_[size_t(pos_.offset + pos_.taken * replicas_ + replica_)];
  ++pos_.taken;
  return w;
}

void DataLoader::next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  inputs.resize(size_t(batch_) * seq_);
  targets.resize(inputs.size());
  const auto& t = *tokens_;
  for (int b = 0; b < batch_; ++b) {
    const int64_t start = next_window() * seq_;
    for (int i = 0; i < seq_; ++i) {
      inputs[size_t(b) * seq_ + i] = t[size_t(start + i)];
      targets[size_t(b) * seq_ + i] = t[size_t(start + i + 1)];
    }
  }
}

void DataLoader::assign(int replica, int replicas, int64_t epoch, int64_t offset) {
  check(replicas >= 1 && replica >= 0 && replica < replicas, "data: replica index out of range");
  check(epoch >= 0 && offset >= 0 && offset <= windows_, "data: assignment outside the data set");
  if (windows_ / replicas < batch_)
    fail("data: " + std::to_string(windows_) + " windows of " + std::to_string(seq_) + " tokens are fewer than " +
         std::to_string(replicas) + " members x batch " + std::to_string(batch_));
  replica_ = replica;
  replicas_ = replicas;
  per_replica_ = windows_ / replicas_;
  pos_ = {epoch, 0, offset};
}

DataLoader::Position DataLoader::next_start() const {
  if (pos_.taken >= rows_in_epoch()) return {pos_.epoch + 1, 0, 0};
  return {pos_.epoch, 0, pos_.offset + pos_.taken * replicas_};
}

void DataLoader::set_position(Position p) {
  check(p.epoch >= 0 && p.taken >= 0 && p.offset >= 0 && p.offset <= windows_ &&
            p.taken <= (windows_ - p.offset) / replicas_,
        "data: saved loader position (epoch " + std::to_string(p.epoch) + ", " + std::to_string(p.taken) +
            " windows) does not fit this data set");
  pos_ = p;
}

}  // namespace loco

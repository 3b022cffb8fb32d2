#include "elastic/join_state.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/error.h"

namespace loco {

std::string encode_join_state(const JoinState& s) {
  const nlohmann::json head = {{"step", s.step},
                               {"data_epoch", s.data_epoch},
                               {"data_offset", s.data_offset},
                               {"optimizer_steps", s.optimizer_steps},
                               {"epoch", s.epoch},
                               {"floats", s.outer.theta.size()},
                               {"inner_bytes", s.inner.size()},
                               {"norm_history", norm_history_text(s.outer.norm_history)},
                               {"slice", s.slice},
                               {"has_optimizer", s.has_optimizer}};
  const std::string h = head.dump();
  std::string out;
  const uint64_t hn = h.size();
  out.append(reinterpret_cast<const char*>(&hn), sizeof hn);
  out += h;
  for (const auto* t : {&s.outer.theta, &s.outer.momentum, &s.m, &s.v})
    out.append(reinterpret_cast<const char*>(t->data()), t->size() * sizeof(float));
  out += s.inner;
  const uint32_t crc = crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  return out;
}

JoinState decode_join_state(const std::string& bytes, size_t n_params, size_t n_trainable, size_t n_histories) {
  auto bad = [](const std::string& why) { fail("elastic: the state received from a peer is corrupt (" + why + ")"); };
  if (bytes.size() < 12) bad("too short");
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  if (crc32c(bytes.data(), bytes.size() - 4) != crc) bad("checksum mismatch");
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  if (hn > bytes.size() - 12) bad("header size");
  JoinState s;
  size_t inner = 0;
  try {  // the header's fields, of the types they must have
    const auto head = nlohmann::json::parse(bytes.substr(8, hn));
    s.step = head.at("step").get<int64_t>();
    s.data_epoch = head.at("data_epoch").get<int64_t>();
    s.data_offset = head.at("data_offset").get<int64_t>();
    s.optimizer_steps = head.at("optimizer_steps").get<int64_t>();
    s.epoch = head.at("epoch").get<std::vector<int64_t>>();
    s.outer.norm_history = parse_norm_history(head.value("norm_history", std::string()), n_histories,
                                        "elastic: the state received from a peer");
    if (head.at("floats").get<size_t>() != n_params) bad("another model size");
    inner = head.at("inner_bytes").get<size_t>();
    s.slice = head.value("slice", -1);
    s.has_optimizer = head.value("has_optimizer", true);
    if (s.slice < -1) bad("slice");
    if (!s.has_optimizer) n_trainable = 0;
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("header: ") + e.what());
  }
  if (!s.has_optimizer && inner != 0) bad("optimizer state without has_optimizer");
  const size_t floats = 8 + hn + (2 * n_params + 2 * n_trainable) * sizeof(float) + 4;
  if (floats > bytes.size() || bytes.size() - floats != inner) bad("size");
  const char* p = bytes.data() + 8 + hn;
  for (auto [t, n] : {std::pair{&s.outer.theta, n_params}, {&s.outer.momentum, n_params}, {&s.m, n_trainable}, {&s.v, n_trainable}}) {
    t->resize(n);
    if (n) std::memcpy(t->data(), p, n * sizeof(float));  // an empty vector's data() may be null
    p += n * sizeof(float);
  }
  s.inner.assign(p, inner);
  return s;
}

}  // namespace loco

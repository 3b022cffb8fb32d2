#include "elastic/secure_channel.h"

#include <sodium.h>

#include <cstring>
#include <initializer_list>
#include <string_view>

#include "core/error.h"

namespace loco {

namespace {

void start_sodium() {
  static const int ok = sodium_init();
  if (ok < 0) fail("elastic: libsodium could not start");
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

std::string_view view(const Nonce& n) { return {reinterpret_cast<const char*>(n.data()), n.size()}; }

// Keyed BLAKE2b-256 over length-prefixed fields (no two field lists hash alike).
Key hash(const uint8_t* key, size_t key_bytes, std::initializer_list<std::string_view> fields) {
  start_sodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, key, key_bytes, kKeyBytes);
  for (const auto& f : fields) {
    std::string len;
    put_u32(len, uint32_t(f.size()));
    crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(len.data()), len.size());
    crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(f.data()), f.size());
  }
  Key out;
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}
Key mac(const Key& k, std::initializer_list<std::string_view> fields) { return hash(k.data(), k.size(), fields); }

std::string u32s(uint32_t a, uint32_t b) {
  std::string s;
  put_u32(s, a);
  put_u32(s, b);
  return s;
}

constexpr char kMagic[8] = {'L', 'O', 'C', 'O', 'S', 'E', 'C', '1'};

std::array<uint8_t, crypto_aead_chacha20poly1305_IETF_NPUBBYTES> frame_nonce(uint64_t counter) {
  std::array<uint8_t, crypto_aead_chacha20poly1305_IETF_NPUBBYTES> n{};
  for (int i = 0; i < 8; ++i) n[i] = uint8_t(counter >> (8 * i));
  return n;
}

}  // namespace

Key derive_run_key(const std::string& secret, const std::string& run_name) {
  if (secret.size() < kMinSecretBytes)
    fail("elastic: the run secret has " + std::to_string(secret.size()) + " bytes; it needs at least " +
         std::to_string(kMinSecretBytes) + " (e.g. head -c 32 /dev/urandom | base64 > run.secret)");
  const Key s = hash(nullptr, 0, {secret});
  return mac(s, {"loco run", run_name});
}

Key derive_transport_key(const Key& run_key, const std::string& transport_id) {
  return mac(run_key, {"transport", transport_id});
}

std::string mac_entry(const Key& run_key, const std::string& name, const std::string& value) {
  const Key m = mac(run_key, {"entry", name, value});
  return to_hex(m.data(), m.size());
}

std::string to_hex(const uint8_t* bytes, size_t n) {
  std::string out(2 * n + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), bytes, n);
  out.pop_back();
  return out;
}

bool entry_mac_ok(const Key& run_key, const std::string& name, const std::string& value, const std::string& m) {
  const std::string want = mac_entry(run_key, name, value);
  return m.size() == want.size() && sodium_memcmp(m.data(), want.data(), want.size()) == 0;
}

Nonce random_nonce() {
  start_sodium();
  Nonce n;
  randombytes_buf(n.data(), n.size());
  return n;
}

std::string make_hello(const Key& kt, uint32_t from, uint32_t to, const Nonce& nonce_c) {
  std::string out(kMagic, sizeof kMagic);
  out += u32s(from, to);
  out += view(nonce_c);
  const Key m = mac(kt, {"hello", u32s(from, to), view(nonce_c)});
  out.append(reinterpret_cast<const char*>(m.data()), m.size());
  return out;
}

bool open_hello(const Key& kt, const uint8_t* b, uint32_t to, uint32_t* from, Nonce* nonce_c) {
  if (std::memcmp(b, kMagic, sizeof kMagic) != 0) return false;
  const uint32_t c = get_u32(b + 8), s = get_u32(b + 12);
  if (s != to || c <= s) return false;
  Nonce n;
  std::memcpy(n.data(), b + 16, n.size());
  const Key m = mac(kt, {"hello", u32s(c, s), view(n)});
  if (crypto_verify_32(m.data(), b + 48) != 0) return false;
  *from = c;
  *nonce_c = n;
  return true;
}

std::string make_welcome(const Key& kt, uint32_t c, uint32_t s, const Nonce& nonce_c, const Nonce& nonce_s) {
  std::string out(view(nonce_s));
  const Key m = mac(kt, {"welcome", u32s(c, s), view(nonce_c), view(nonce_s)});
  out.append(reinterpret_cast<const char*>(m.data()), m.size());
  return out;
}

bool open_welcome(const Key& kt, const uint8_t* b, uint32_t c, uint32_t s, const Nonce& nonce_c, Nonce* nonce_s) {
  Nonce n;
  std::memcpy(n.data(), b, n.size());
  const Key m = mac(kt, {"welcome", u32s(c, s), view(nonce_c), view(n)});
  if (crypto_verify_32(m.data(), b + 32) != 0) return false;
  *nonce_s = n;
  return true;
}

std::string make_confirm(const Key& kt, uint32_t c, uint32_t s, const Nonce& nonce_c, const Nonce& nonce_s) {
  const Key m = mac(kt, {"confirm", u32s(c, s), view(nonce_c), view(nonce_s)});
  return std::string(reinterpret_cast<const char*>(m.data()), m.size());
}

bool confirm_ok(const Key& kt, const uint8_t* b, uint32_t c, uint32_t s, const Nonce& nonce_c, const Nonce& nonce_s) {
  const Key m = mac(kt, {"confirm", u32s(c, s), view(nonce_c), view(nonce_s)});
  return crypto_verify_32(m.data(), b) == 0;
}

Key direction_key(const Key& kt, uint32_t sender, uint32_t receiver, const Nonce& nonce_c, const Nonce& nonce_s) {
  return mac(kt, {"key", u32s(sender, receiver), view(nonce_c), view(nonce_s)});
}

void FrameSealer::seal(uint32_t channel, bool last, const void* data, size_t n, std::string& out) {
  check(n <= kMaxFrame, "internal: a frame larger than kMaxFrame");
  std::string header;
  put_u32(header, channel);
  put_u32(header, uint32_t(n));
  put_u32(header, last ? kFrameLast : 0);
  const size_t at = out.size();
  out += header;
  out.resize(at + kFrameHeaderBytes + n + kFrameTagBytes);
  auto* body = reinterpret_cast<uint8_t*>(out.data() + at + kFrameHeaderBytes);
  const auto nonce = frame_nonce(counter_++);
  unsigned long long tag_bytes = 0;
  crypto_aead_chacha20poly1305_ietf_encrypt_detached(
      body, body + n, &tag_bytes, static_cast<const uint8_t*>(data), n,
      reinterpret_cast<const uint8_t*>(header.data()), header.size(), nullptr, nonce.data(), key_.data());
}

FrameHeader FrameOpener::header(const uint8_t* b) const {
  FrameHeader h{get_u32(b), get_u32(b + 4), get_u32(b + 8)};
  if (h.channel >= channels_) fail("a frame on channel " + std::to_string(h.channel) + ", which does not exist");
  if (h.length > kMaxFrame)
    fail("a frame of " + std::to_string(h.length) + " bytes (at most " + std::to_string(kMaxFrame) + ")");
  if (h.flags & ~kFrameLast) fail("a frame with unknown flags " + std::to_string(h.flags));
  return h;
}

void FrameOpener::open(const uint8_t* hbytes, const FrameHeader& h, const uint8_t* body, uint8_t* out) {
  const auto nonce = frame_nonce(counter_);
  if (crypto_aead_chacha20poly1305_ietf_decrypt_detached(out, nullptr, body, h.length, body + h.length, hbytes,
                                                         kFrameHeaderBytes, nonce.data(), key_.data()) != 0)
    fail("a frame that fails authentication (forged, altered, replayed or out of order)");
  ++counter_;
}

}  // namespace loco

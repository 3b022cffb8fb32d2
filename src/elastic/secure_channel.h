#pragma once
// The elastic data plane's cryptography (libsodium), free of sockets so that it can be tested
// and fuzzed on its own. Every connection between two members of a quorum is authenticated and
// encrypted under keys derived from the run's secret:
//
//   run key        K_run = BLAKE2b(key = BLAKE2b(secret), "loco run" | run name)
//   transport key  K_t   = BLAKE2b(key = K_run, "transport" | transport id)
//
// where the transport id names the round, the attempt and the transport's purpose, so nothing
// sealed for one attempt opens in another. A connection from member c to member s (c > s; the
// higher rank connects) is a three-message handshake, each message a fixed size:
//
//   HELLO    c -> s   magic | c | s | nonce_c | MAC(K_t, "hello" | c | s | nonce_c)
//   WELCOME  s -> c   nonce_s | MAC(K_t, "welcome" | c | s | nonce_c | nonce_s)
//   CONFIRM  c -> s   MAC(K_t, "confirm" | c | s | nonce_c | nonce_s)
//
// Nonces are 32 random bytes. A replayed HELLO earns a fresh nonce_s that only a holder of K_t
// can CONFIRM, so a listener gives a peer's place only to a connection that confirmed. Each
// direction then has its own key, BLAKE2b(K_t, "key" | sender | receiver | nonce_c | nonce_s),
// and carries frames:
//
//   header (12 bytes: channel, length, flags; little-endian u32) | ciphertext | 16-byte tag
//
// sealed with ChaCha20-Poly1305 (IETF), the header as associated data and the frame's number in
// the direction as the nonce: a frame that is forged, altered, replayed, reordered or moved to
// another connection fails to open. A frame holds at most kMaxFrame bytes; a message is a
// sequence of frames on one channel, the last one flagged. Headers are checked before any
// allocation or read of the body.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

constexpr size_t kKeyBytes = 32;
using Key = std::array<uint8_t, kKeyBytes>;
using Nonce = std::array<uint8_t, 32>;

// A run's secret: at least this many bytes.
constexpr size_t kMinSecretBytes = 16;

// K_run; fails if the secret is shorter than kMinSecretBytes or libsodium cannot start.
Key derive_run_key(const std::string& secret, const std::string& run_name);
Key derive_transport_key(const Key& run_key, const std::string& transport_id);
// A MAC of a Redis entry's value under K_run (hex, 64 characters), and its check.
std::string mac_entry(const Key& run_key, const std::string& name, const std::string& value);
bool entry_mac_ok(const Key& run_key, const std::string& name, const std::string& value, const std::string& mac);

Nonce random_nonce();
// Lower-case hex of n bytes.
std::string to_hex(const uint8_t* bytes, size_t n);

constexpr size_t kHelloBytes = 8 + 4 + 4 + 32 + 32;
constexpr size_t kWelcomeBytes = 32 + 32;
constexpr size_t kConfirmBytes = 32;

std::string make_hello(const Key& kt, uint32_t from, uint32_t to, const Nonce& nonce_c);
// Checks a HELLO addressed to `to`: its magic, destination and MAC; returns the sender's rank
// and nonce; false for anything else.
bool open_hello(const Key& kt, const uint8_t* bytes, uint32_t to, uint32_t* from, Nonce* nonce_c);
std::string make_welcome(const Key& kt, uint32_t c, uint32_t s, const Nonce& nonce_c, const Nonce& nonce_s);
bool open_welcome(const Key& kt, const uint8_t* bytes, uint32_t c, uint32_t s, const Nonce& nonce_c, Nonce* nonce_s);
std::string make_confirm(const Key& kt, uint32_t c, uint32_t s, const Nonce& nonce_c, const Nonce& nonce_s);
bool confirm_ok(const Key& kt, const uint8_t* bytes, uint32_t c, uint32_t s, const Nonce& nonce_c,
                const Nonce& nonce_s);
Key direction_key(const Key& kt, uint32_t sender, uint32_t receiver, const Nonce& nonce_c, const Nonce& nonce_s);

constexpr size_t kFrameHeaderBytes = 12;
constexpr size_t kFrameTagBytes = 16;
constexpr size_t kMaxFrame = size_t(1) << 16;  // small, so that a message's last frame adds little latency
constexpr uint32_t kFrameLast = 1;

struct FrameHeader {
  uint32_t channel = 0, length = 0, flags = 0;
};

// Seals frames of one direction (numbers them from 0).
class FrameSealer {
 public:
  explicit FrameSealer(const Key& key) : key_(key) {}
  // Appends header | ciphertext | tag of `n` (<= kMaxFrame) bytes at `data` to `out`.
  void seal(uint32_t channel, bool last, const void* data, size_t n, std::string& out);

 private:
  Key key_;
  uint64_t counter_ = 0;
};

// Opens the frames of one direction, in order.
class FrameOpener {
 public:
  FrameOpener(const Key& key, uint32_t num_channels) : key_(key), channels_(num_channels) {}
  // Parses and checks a header (channel, length, flags) before anything is read of the body;
  // throws a loco error naming what is wrong.
  FrameHeader header(const uint8_t* bytes) const;
  // Opens the body (ciphertext | tag, h.length + kFrameTagBytes bytes) of the frame whose header
  // is `hbytes`, writing h.length plaintext bytes to `out`; throws if it fails to authenticate.
  void open(const uint8_t* hbytes, const FrameHeader& h, const uint8_t* body, uint8_t* out);

 private:
  Key key_;
  uint32_t channels_;
  uint64_t counter_ = 0;
};

}  // namespace loco

#pragma once
// The elastic backend's data plane: a Transport over TCP connections between the members of one
// quorum, every byte authenticated and encrypted (elastic/secure_channel.h) under a key derived
// from the run's secret and the transport's id (round, attempt, purpose).
//
// Each member whose peers include a higher rank listens on a port of its own for this transport
// and publishes HOST:PORT in the run's Redis with a MAC; it connects to every lower rank. A
// listener gives a rank's place only to a connection that completes the handshake within the
// timeout: an outsider's connection (random bytes, a crafted header, a replayed HELLO, or
// nothing at all) is dropped with a warning and the quorum forms regardless. After setup each
// peer has a writer thread (sends are buffered, never wait for the receiver) and a reader thread
// (frames are opened, checked and queued per channel). Any failure to authenticate, a frame that
// breaks the rules, or a peer that stops taking data for the timeout fails the transport: every
// later call fails with the reason, and the quorum is formed again with a new transport.
// Sockets are written with MSG_NOSIGNAL: a closed peer is an error, never a SIGPIPE.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/transport.h"
#include "elastic/secure_channel.h"

namespace loco {

class Redis;

// Where the members of a transport publish and look up their listening addresses: the run's
// Redis, or a map in tests. Entries carry a MAC; a forged or malformed one is ignored.
class AddressBook {
 public:
  virtual ~AddressBook() = default;
  virtual void put(const std::string& key, const std::string& value) = 0;
  virtual bool get(const std::string& key, std::string* value) = 0;
};
std::unique_ptr<AddressBook> redis_address_book(Redis& redis);

// An address book in memory, for members that are threads of one process (tests, benchmarks).
class MemoryAddressBook : public AddressBook {
 public:
  void put(const std::string& key, const std::string& value) override;
  bool get(const std::string& key, std::string* value) override;

 private:
  std::mutex mu_;
  std::map<std::string, std::string> entries_;
};

struct SecureTransportOptions {
  std::string address;   // where peers reach this member ("": this host's name)
  double timeout_s = 5;  // connecting and authenticating; any wait on a peer
};

// Connects to the other `size` members of the transport `transport_id` (its address entries
// start with `key_prefix`; this process is `rank`); throws if they do not all connect and
// authenticate within the timeout.
std::unique_ptr<Transport> make_secure_transport(AddressBook& book, const std::string& key_prefix, const Key& run_key,
                                                 const std::string& transport_id, int rank, int size,
                                                 const SecureTransportOptions& options);

// Largest message a peer may send (bytes): a frame that would take a message past it fails the
// transport.
constexpr uint64_t kMaxMessageBytes = uint64_t(1) << 36;

}  // namespace loco

#include "algo/outer_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"

namespace loco {

namespace {

// to = from (to resized), on the compute threads.
void copy_whole(const std::vector<float>& from, std::vector<float>& to) {
  pack_ranges(from.data(), {{0, int64_t(from.size())}}, to);
}

// The fragments' packed values laid out in the flat buffer's layout (n values).
void unpack_all(const std::vector<std::vector<float>>& parts, const std::vector<std::vector<Range>>& fragments,
                int64_t n, std::vector<float>& out) {
  out.resize(size_t(n));
  for (size_t j = 0; j < fragments.size(); ++j) unpack_ranges(parts[j].data(), fragments[j], out.data());
}

}  // namespace

OuterStore::OuterStore(std::vector<std::vector<Range>> fragments, int64_t n, const std::string& file)
    : fragments_(std::move(fragments)), n_(n), file_(file) {
  int64_t covered = 0;
  for (const auto& f : fragments_) covered += total_size(f);
  check(covered == n_, "internal: the outer state's fragments hold " + std::to_string(covered) + " of " +
                           std::to_string(n_) + " values");
  if (file_.empty()) {
    for (const auto& f : fragments_) {
      theta_.push_back(zeroed_floats(size_t(total_size(f))));
      momentum_.push_back(zeroed_floats(size_t(total_size(f))));
    }
    return;
  }
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) fail("cannot create the outer-state file " + file_ + ": " + std::strerror(errno));
  if (::ftruncate(fd_, off_t(2 * n_ * int64_t(sizeof(float)))) != 0)
    fail("cannot size the outer-state file " + file_ + ": " + std::strerror(errno));
}

OuterStore::~OuterStore() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(file_.c_str());
}

void OuterStore::read_at(int64_t offset, float* data, int64_t count) const {
  char* p = reinterpret_cast<char*>(data);
  int64_t left = count * int64_t(sizeof(float)), at = offset * int64_t(sizeof(float));
  while (left > 0) {
    const ssize_t done = ::pread(fd_, p, size_t(left), off_t(at));
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) fail("outer-state file " + file_ + ": " + (done < 0 ? std::strerror(errno) : "short read"));
    p += done;
    at += done;
    left -= done;
  }
}

void OuterStore::write_at(int64_t offset, const float* data, int64_t count) const {
  const char* p = reinterpret_cast<const char*>(data);
  int64_t left = count * int64_t(sizeof(float)), at = offset * int64_t(sizeof(float));
  while (left > 0) {
    const ssize_t done = ::pwrite(fd_, p, size_t(left), off_t(at));
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) fail("outer-state file " + file_ + ": " + (done < 0 ? std::strerror(errno) : "short write"));
    p += done;
    at += done;
    left -= done;
  }
}

void OuterStore::read(size_t j, std::vector<float>& theta, std::vector<float>& momentum) const {
  const auto& ranges = fragments_[j];
  if (fd_ < 0) {
    copy_whole(theta_[j], theta);
    copy_whole(momentum_[j], momentum);
    return;
  }
  theta.resize(size_t(total_size(ranges)));
  momentum.resize(theta.size());
  size_t k = 0;
  for (const auto& r : ranges) {
    read_at(r.begin, theta.data() + k, r.size());
    read_at(n_ + r.begin, momentum.data() + k, r.size());
    k += size_t(r.size());
  }
}

void OuterStore::write(size_t j, const std::vector<float>& theta, const std::vector<float>& momentum) {
  const auto& ranges = fragments_[j];
  check(int64_t(theta.size()) == total_size(ranges) && momentum.size() == theta.size(),
        "internal: outer-state fragment of the wrong size");
  if (fd_ < 0) {
    copy_whole(theta, theta_[j]);
    copy_whole(momentum, momentum_[j]);
    return;
  }
  size_t k = 0;
  for (const auto& r : ranges) {
    write_at(r.begin, theta.data() + k, r.size());
    write_at(n_ + r.begin, momentum.data() + k, r.size());
    k += size_t(r.size());
  }
}

void OuterStore::exchange(size_t j, std::vector<float>& theta, std::vector<float>& momentum) {
  auto exact = [n = fd_ < 0 ? theta_[j].size() : 0](const std::vector<float>& v) {
    return v.size() == n && v.capacity() == n;
  };
  if (fd_ >= 0 || !exact(theta) || !exact(momentum)) {
    write(j, theta, momentum);
    return;
  }
  theta.swap(theta_[j]);
  momentum.swap(momentum_[j]);
}

int64_t OuterStore::resident_bytes() const {
  int64_t bytes = 0;
  for (size_t j = 0; j < theta_.size(); ++j) bytes += int64_t(theta_[j].capacity() + momentum_[j].capacity()) * 4;
  return bytes;
}

void OuterStore::read_params(std::vector<float>& theta) const {
  if (fd_ < 0) {
    unpack_all(theta_, fragments_, n_, theta);
    return;
  }
  theta.resize(size_t(n_));
  read_at(0, theta.data(), n_);
}

void OuterStore::read_all(std::vector<float>& theta, std::vector<float>& momentum) const {
  read_params(theta);
  if (fd_ < 0) {
    unpack_all(momentum_, fragments_, n_, momentum);
    return;
  }
  momentum.resize(size_t(n_));
  read_at(n_, momentum.data(), n_);
}

void OuterStore::write_all(const std::vector<float>& theta, const std::vector<float>& momentum) {
  check(int64_t(theta.size()) == n_ && int64_t(momentum.size()) == n_, "internal: outer state of the wrong size");
  if (fd_ < 0) {
    for (size_t j = 0; j < fragments_.size(); ++j) {
      pack_ranges(theta.data(), fragments_[j], theta_[j]);
      pack_ranges(momentum.data(), fragments_[j], momentum_[j]);
    }
    return;
  }
  write_at(0, theta.data(), n_);
  write_at(n_, momentum.data(), n_);
}

}  // namespace loco

#include "core/fs.h"

#include <cstdio>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace loco {

namespace {

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path + ": write failed: " + std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::filesystem::path target(path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) fail(tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path + ": rename failed: " + std::strerror(err));
  }
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(path + ": read failed");
  return ss.str();
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) fail(path + ": cannot create directory: " + ec.message());
}

bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

void append_line(const std::string& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail(path + ": cannot open for appending: " + std::strerror(errno));
  try {
    // What follows the last newline: nothing, or an earlier append cut short (a crash, a full
    // disk). Cut short, it is removed so that this line is a line of its own; a whole record
    // that lacks only its newline gets one.
    const off_t end = ::lseek(fd, 0, SEEK_END);
    if (end < 0) fail(path + ": cannot seek: " + std::strerror(errno));
    off_t start = end;
    std::string tail;
    for (char c; start > 0; --start) {
      const ssize_t r = ::pread(fd, &c, 1, start - 1);
      if (r != 1) fail(path + ": read failed: " + std::strerror(r < 0 ? errno : EIO));
      if (c == '\n') break;
      tail += c;
    }
    std::reverse(tail.begin(), tail.end());  // read backwards
    std::string text = line + "\n";
    if (!tail.empty() && nlohmann::json::accept(tail)) {
      text = "\n" + text;
    } else if (!tail.empty()) {
      if (::ftruncate(fd, start) != 0) fail(path + ": cannot truncate: " + std::strerror(errno));
      if (::lseek(fd, start, SEEK_SET) < 0) fail(path + ": cannot seek: " + std::strerror(errno));
    }
    write_all(fd, text.data(), text.size(), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail(path + ": cannot write: " + std::strerror(errno));
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail(path + ": invalid JSON");
  }
}


}  // namespace loco

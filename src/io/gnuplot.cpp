#include "io/gnuplot.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"

namespace loco {

GnuplotJob::GnuplotJob() {
  static std::atomic<int> counter{0};
  dir_ = std::filesystem::temp_directory_path().string() + "/loco-plot-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
  make_dirs(dir_);
}

GnuplotJob::~GnuplotJob() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string GnuplotJob::data(const std::string& name, const std::string& content) {
  const std::string path = dir_ + "/" + name;
  write_file_atomic(path, content);
  return path;
}

std::string GnuplotJob::terminal(const std::string& out, int width, int height) {
  const bool svg = out.size() > 4 && out.substr(out.size() - 4) == ".svg";
  const std::string size = " size " + std::to_string(width) + "," + std::to_string(height);
  return std::string("set terminal ") + (svg ? "svg" : "pngcairo") + size + "\nset output '" + out + "'\n";
}

void GnuplotJob::run(const std::string& script) {
  const std::string gp = data("plot.gp", script + "\n");
  const int rc = std::system(("gnuplot '" + gp + "' 2> '" + dir_ + "/err'").c_str());
  if (rc != 0) {
    const std::string err = file_exists(dir_ + "/err") ? read_file(dir_ + "/err") : "";
    fail("gnuplot failed (is gnuplot installed? apt-get install gnuplot-nox): " + err.substr(0, 200));
  }
}

}  // namespace loco

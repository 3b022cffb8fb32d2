#pragma once
// Runs gnuplot on a script with its data files in a private temporary directory.
#include <string>

namespace loco {

class GnuplotJob {
 public:
  GnuplotJob();
  ~GnuplotJob();
  GnuplotJob(const GnuplotJob&) = delete;
  GnuplotJob& operator=(const GnuplotJob&) = delete;
  // Writes a data file and returns its path, for use in the script.
  std::string data(const std::string& name, const std::string& content);
  // "set terminal ... ; set output ..." for a .png or .svg file.
  static std::string terminal(const std::string& out, int width, int height);
  // Runs the script; fails with gnuplot's message if it does not succeed.
  void run(const std::string& script);

 private:
  std::string dir_;
};

}  // namespace loco

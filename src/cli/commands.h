#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>

namespace loco::cli {

// For a number option: its text must be a finite number (CLI11 reads "nan" and "inf" as numbers,
// and its Range check lets NaN through).
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        return std::isfinite(v) ? std::string() : "not a finite number: " + text;
      },
      "FINITE");
}

// Each adds its subcommand to the app; the callback runs the command.
void add_init(CLI::App& app);
void add_grad(CLI::App& app);
void add_eval(CLI::App& app);
void add_data(CLI::App& app);
void add_train(CLI::App& app);
void add_plot(CLI::App& app);
void add_compare(CLI::App& app);
void add_report(CLI::App& app);
void add_generate(CLI::App& app);
void add_info(CLI::App& app);
void add_simulate(CLI::App& app);
void add_estimate(CLI::App& app);
// `loco simulate pipeline`, added by add_simulate.
void add_simulate_pipeline(CLI::App& simulate);

}  // namespace loco::cli

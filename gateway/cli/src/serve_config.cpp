// Where `cellgate serve`'s values come from (cellgate/cli/serve.hpp): Kernel Gateway's KG_*
// names, the default config files, and --print-config.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cellgate/cli/serve.hpp"
#include "cellgate/server/server.hpp"

namespace cellgate::cli {
namespace {

// Kernel Gateway's environment variables that mean what one of ours does (its
// KernelGatewayApp traits), by the long option name.
struct Alias {
  const char* kg;
  const char* option;
};
constexpr Alias kAliases[] = {
    {"KG_PORT", "port"},
    {"KG_IP", "ip"},
    {"KG_AUTH_TOKEN", "token"},
    {"KG_BASE_URL", "base-url"},
    {"KG_ALLOW_ORIGIN", "allow-origin"},
    {"KG_MAX_KERNELS", "max-kernels"},
    {"KG_PRESPAWN_COUNT", "pool-size"},
    {"KG_DEFAULT_KERNEL_NAME", "default-kernel"},
    {"KG_ENV_PROCESS_WHITELIST", "env-allow"},
    {"KG_CERTFILE", "certfile"},
    {"KG_KEYFILE", "keyfile"},
    {"KG_CLIENT_CA", "client-ca"},
    {"KG_WS_PING_INTERVAL_SECS", "ws-ping-interval"},
    {"KG_API", "api"},
    {"KG_SEED_URI", "seed"},
    {"KG_FORCE_KERNEL_NAME", "force-kernel"},
    {"KG_LIST_KERNELS", "list-kernels"},
    {"KG_ALLOW_NOTEBOOK_DOWNLOAD", "allow-notebook-download"},
    {"KG_STATIC_PATH", "static-path"},
};

// Kernel Gateway's command-line spellings (traitlets' --Class.trait=value, and its own aliases),
// by the long option name they are read as.
constexpr Alias kTraitAliases[] = {
    {"KernelGatewayApp.ip", "ip"},
    {"KernelGatewayApp.port", "port"},
    {"KernelGatewayApp.base_url", "base-url"},
    {"KernelGatewayApp.auth_token", "token"},
    {"KernelGatewayApp.allow_origin", "allow-origin"},
    {"KernelGatewayApp.max_kernels", "max-kernels"},
    {"KernelGatewayApp.api", "api"},
    {"KernelGatewayApp.seed_uri", "seed"},
    {"KernelGatewayApp.prespawn_count", "prespawn"},
    {"KernelGatewayApp.default_kernel_name", "default-kernel"},
    {"KernelGatewayApp.force_kernel_name", "force-kernel"},
    {"KernelGatewayApp.list_kernels", "list-kernels"},
    {"KernelGatewayApp.certfile", "certfile"},
    {"KernelGatewayApp.keyfile", "keyfile"},
    {"KernelGatewayApp.client_ca", "client-ca"},
    {"NotebookHTTPPersonality.allow_notebook_download", "allow-notebook-download"},
    {"NotebookHTTPPersonality.static_path", "static-path"},
    {"seed_uri", "seed"},
    {"client-ca", "client-ca"},
};

// `--KernelGatewayApp.seed_uri=x.ipynb` (or with the value as the next argument) → `--seed
// x.ipynb`; a boolean trait's True → the flag, False → nothing. Other arguments pass unchanged.
std::vector<std::string> translate_traits(std::vector<std::string> args) {
  std::vector<std::string> out;
  bool in_serve = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!in_serve || !arg.starts_with("--") || arg == "--") {
      in_serve = in_serve || arg == "serve";
      out.push_back(arg);
      continue;
    }
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Alias* alias = nullptr;
    for (const Alias& a : kTraitAliases) {
      if (name == a.kg) {
        alias = &a;
      }
    }
    if (alias == nullptr) {
      out.push_back(arg);
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    }
    if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);  // traitlets reads 'x' as x
    }
    const std::string option = std::string("--") + alias->option;
    if (option == "--allow-notebook-download") {
      if (value == "True" || value == "true" || value == "1") {
        out.push_back(option);
      }
      continue;
    }
    out.push_back(option);
    out.push_back(value);
  }
  return out;
}

std::string env_or_empty(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  return value != nullptr ? value : "";
}

// The long names given on the command line after `serve` ("--port 1", "--port=1").
std::set<std::string> given_on_command_line(int argc, const char* const* argv) {
  std::set<std::string> names;
  bool in_serve = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!in_serve) {
      in_serve = arg == "serve";
      continue;
    }
    if (arg == "--") {
      break;
    }
    if (arg.starts_with("--") && arg.size() > 2) {
      names.insert(arg.substr(2, arg.find('=') - 2));
    }
  }
  return names;
}

// The default config files that exist, lowest precedence first.
std::vector<std::string> default_config_files() {
  std::vector<std::string> candidates = {"/etc/cellgate/cellgate.toml"};
  if (std::string xdg = env_or_empty("XDG_CONFIG_HOME"); !xdg.empty()) {
    candidates.push_back(xdg + "/cellgate/cellgate.toml");
  } else if (std::string home = env_or_empty("HOME"); !home.empty()) {
    candidates.push_back(home + "/.config/cellgate/cellgate.toml");
  }
  std::vector<std::string> found;
  for (const auto& path : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) {
      found.push_back(path);
    }
  }
  return found;
}

bool is_flag(const CLI::Option& option) {
  return option.get_expected_max() == 0;
}

bool looks_numeric(const std::string& value) {
  if (value.empty()) {
    return false;
  }
  char* end = nullptr;
  std::strtod(value.c_str(), &end);
  return end != nullptr && *end == '\0';
}

std::string toml_string(const std::string& value) {
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[(c >> 4) & 0xf];
      out += kHex[c & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string toml_value(const CLI::Option& option, const std::vector<std::string>& values) {
  if (is_flag(option)) {
    const std::string last = values.empty() ? "false" : values.back();
    const bool off =
        last == "false" || last == "0" || last == "off" || last == "no" || last == "-1";
    return off ? "false" : "true";
  }
  auto scalar = [](const std::string& v) { return looks_numeric(v) ? v : toml_string(v); };
  if (option.get_items_expected_max() > 1) {
    std::string out = "[";
    for (std::size_t i = 0; i < values.size(); ++i) {
      out += (i == 0 ? "" : ", ") + scalar(values[i]);
    }
    return out + "]";
  }
  return scalar(values.empty() ? std::string() : values.back());
}

// The config files `--config` names, in order (a later one wins).
std::vector<std::string> config_files(const CLI::App& cmd) {
  const CLI::Option* config = cmd.get_option_no_throw("--config");
  return config != nullptr && config->count() > 0 ? config->results() : std::vector<std::string>{};
}

// The files' values for the options neither the command line nor the environment set. CLI11 2.1
// reads a subcommand's config option but never the files it names (only the top level's), so the
// files are read here, after parsing: the latest file first, each value taken only by an option
// still unset; `applied` gets the file each applied value came from (for --print-config). Returns
// what is wrong with a file (unreadable, an unknown key, a bad value), or "".
std::string apply_config_files(CLI::App& cmd, std::map<std::string, std::string>& applied) {
  const std::vector<std::string> files = config_files(cmd);
  for (auto file = files.rbegin(); file != files.rend(); ++file) {
    std::vector<CLI::ConfigItem> items;
    try {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(*file, ec)) {
        return "config file " + *file + ": no such file";
      }
      items = CLI::ConfigTOML().from_file(*file);
    } catch (const CLI::Error& e) {
      return "config file " + *file + ": " + e.what();
    }
    for (const auto& item : items) {
      const bool top = item.parents.empty() || item.parents == std::vector<std::string>{"serve"};
      CLI::Option* option = top ? cmd.get_option_no_throw("--" + item.name) : nullptr;
      if (option == nullptr || item.name == "config" || item.name == "help" ||
          item.name == "print-config") {
        return "config file " + *file + ": unknown key '" + item.fullname() +
               "' (keys are `cellgate serve --help`'s long option names)";
      }
      if (option->count() > 0) {
        continue;  // the command line, the environment or a later file set it
      }
      if (!is_flag(*option) && item.inputs.empty()) {
        continue;  // `key = []`: an empty list, as by default
      }
      try {
        if (is_flag(*option)) {
          option->add_result(item.inputs.empty() ? std::string("true") : item.inputs.back());
        } else {
          option->add_result(item.inputs);
        }
        option->run_callback();
        applied[item.name] = *file;
      } catch (const CLI::Error& e) {
        return "config file " + *file + ": " + item.name + ": " + e.what();
      }
    }
  }
  return "";
}

// `from_file`: the file each value apply_config_files took came from.
int print_config(const CLI::App& cmd, int argc, const char* const* argv,
                 const ServeEnvironment& environment,
                 const std::map<std::string, std::string>& from_file) {
  const std::set<std::string> from_command_line = given_on_command_line(argc, argv);
  const std::vector<std::string> files = config_files(cmd);
  std::cout << "# cellgate serve: the effective configuration. Config files read: "
            << (files.empty() ? std::string("none") : CLI::detail::join(files, ", ")) << "\n";
  for (const CLI::Option* option : cmd.get_options()) {
    if (option->get_lnames().empty()) {
      continue;
    }
    const std::string& name = option->get_lnames().front();
    if (name == "help" || name == "config" || name == "print-config") {
      continue;
    }
    std::string source = "default";
    const std::string env = option->get_envname();
    if (from_command_line.contains(name)) {
      source = "command line";
    } else if (!env.empty() && !env_or_empty(env).empty()) {
      auto alias = environment.aliases.find(env);
      source = alias != environment.aliases.end()
                   ? "environment " + alias->second + " (Kernel Gateway's name for " + env + ")"
                   : "environment " + env;
    } else if (auto file = from_file.find(name); file != from_file.end()) {
      source = "config file " + file->second;
    }
    std::vector<std::string> values;
    if (option->count() > 0) {
      values = option->results();
    } else if (const std::string def = option->get_default_str();
               !def.empty() && !is_flag(*option)) {
      values = {def};
      // A list's default reads "[a,b]" ("[]": empty).
      if (option->get_items_expected_max() > 1 && def.front() == '[' && def.back() == ']') {
        values = CLI::detail::split(def.substr(1, def.size() - 2), ',');
        if (values.size() == 1 && values.front().empty()) {
          values.clear();
        }
      }
    }
    if (name == "token" && !values.empty() && !values.back().empty()) {
      std::cout << "# token = (hidden)  # " << source << "\n";
    } else if (values.empty() && !is_flag(*option) && option->get_items_expected_max() <= 1) {
      std::cout << "# " << name << " = (not set)  # " << source << "\n";
    } else {
      std::cout << name << " = " << toml_value(*option, values) << "  # " << source << "\n";
    }
  }
  return 0;
}

}  // namespace

ServeEnvironment prepare_serve_parse(const CLI::App& serve_command, int argc,
                                     const char* const* argv) {
  ServeEnvironment environment;
  for (const Alias& alias : kAliases) {
    const std::string value = env_or_empty(alias.kg);
    if (value.empty()) {
      continue;
    }
    const CLI::Option* option = serve_command.get_option_no_throw(std::string("--") + alias.option);
    if (option == nullptr) {
      continue;
    }
    const std::string ours = option->get_envname();
    if (!env_or_empty(ours).empty()) {
      environment.notices.push_back(std::string(alias.kg) + " is ignored: " + ours +
                                    " is set too and wins");
      continue;
    }
    ::setenv(ours.c_str(), value.c_str(), 1);
    environment.aliases[ours] = alias.kg;
    environment.notices.push_back(std::string(alias.kg) + " (Kernel Gateway's name) is read as " +
                                  ours + " (--" + alias.option + ")");
  }
  // The arguments to parse: these, and with no --config on the command line the default files
  // that exist as `--config FILE` right after `serve` (the user's last: it wins).
  for (int i = 0; i < argc; ++i) {
    environment.args.emplace_back(argv[i]);
  }
  environment.args = translate_traits(std::move(environment.args));
  if (!given_on_command_line(argc, argv).contains("config")) {
    auto serve = std::find(environment.args.begin() + 1, environment.args.end(), "serve");
    if (serve != environment.args.end()) {
      std::vector<std::string> files;
      for (const auto& file : default_config_files()) {
        files.insert(files.end(), {"--config", file});
      }
      environment.args.insert(serve + 1, files.begin(), files.end());
    }
  }
  return environment;
}

int run_serve_command(ServeCommandLine& serve, CLI::App& serve_command, int argc,
                      const char* const* argv, const ServeEnvironment& environment) {
  std::map<std::string, std::string> from_file;
  if (const std::string problem = apply_config_files(serve_command, from_file); !problem.empty()) {
    std::cerr << "cellgate serve: " << problem << "\n";
    return 2;
  }
  if (serve.print_config) {
    return print_config(serve_command, argc, argv, environment, from_file);
  }
  server::set_up_logging(serve.options);
  for (const auto& notice : environment.notices) {
    spdlog::info("config: {}", notice);
  }
  if (serve.options.prespawn == 0 && serve.options.api == "notebook-http") {
    // Kernel Gateway's prespawn_count (KG_PRESPAWN_COUNT is read as --pool-size), else 1.
    const CLI::Option* pool = serve_command.get_option_no_throw("--pool-size");
    serve.options.prespawn = pool != nullptr && pool->count() > 0 ? serve.options.pool_size : 1;
  }
  serve.options.zygote = !serve.no_zygote;
  serve.options.chart_data = !serve.no_chart_data;
  return server::run_serve(std::move(serve.options));
}

}  // namespace cellgate::cli

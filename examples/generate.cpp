// specdec-generate: speculative decoding with SmolLM2 (or any llama-architecture GGUF) from the command line.
//
//   specdec-generate --prompt "The capital of France is" --compare
//   specdec-generate --chat --prompt "Summarise: ..." --draft early-exit:8 --temp 0.7 --sampling coupled --json
//
// Reads top-down: arguments -> models -> one run per decoder -> text, summary or JSON.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

#include <specdec/llama/llama.hpp>
#include <specdec/specdec.hpp>

#include "json_text.hpp"

namespace {

using namespace specdec;
using examples::json_string;
using llama::LlamaModel;
using llama::Tokenizer;

constexpr const char* kUsage = R"(usage: specdec-generate [options]
  --model PATH              GGUF model (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
  --prompt TEXT             the prompt (default "The capital of France is")
  --chat                    wrap the prompt in the model's chat template
  --draft KIND              none | ngram[:N] (N-gram prompt lookup, N up to 16, default 16) | early-exit:L |
                            PATH of a second GGUF (default ngram)
  --k N                     draft length, 1..64 (default 4; with --adaptive, the largest allowed, default 8)
  --adaptive                choose the draft length each round (AdaptiveDraftLength)
  --max-tokens N            new tokens at most (default 128)
  --temp T                  temperature; 0 = greedy (default 0)
  --top-k N                 keep the N most probable tokens (default 0 = off)
  --top-p P                 nucleus sampling mass in (0, 1] (default 1)
  --sampling rejection|coupled   acceptance policy when --temp > 0 (default rejection)
  --seed S                  random seed (default 0)
  --threads N               threads, 1..256 (default 1)
  --format F                in-memory weights: f32 | bf16 | bf16_dot | quantized | quantized_dot (default
                            quantized_dot: integer dot products with inputs rounded to int8 per 32
                            columns; quantized: the same products with 24-bit inputs, about as
                            precise as float math, slower on verify passes)
  --max-context N           KV cache positions, 1..131072 (default 4096)
  --kv-format F             KV cache element: f16 (half precision, as llama.cpp's default; half the bytes
                            attention reads) | f32 (keys and values exactly as computed) | q8 (8-bit
                            integers and a scale per row, about half f16's bytes, for long contexts)
                            (default f16)
  --compare                 also run plain decoding with the same settings
  --json                    print one JSON object instead of text and a summary
)";

/// Whether the text streamed to stdout has a line open: an error reported meanwhile starts a new line first.
bool stdout_line_open = false;

/// Throws where writing to stdout failed (a full disk, a closed descriptor): the output would be lost unsaid.
/// (A pipe whose reader has gone ends the program by SIGPIPE first, as it ends other tools.)
void check_stdout() {
  if (!(std::cout << std::flush)) throw specdec::Error("cannot write to standard output");
}

/// Streams `text` to stdout as valid UTF-8 (examples::utf8_text), keeping stdout_line_open; throws as check_stdout
/// where the write fails, so that a generation whose text is lost stops at once.
void stream_out(std::string_view text) {
  std::cout << examples::utf8_text(text);
  check_stdout();
  if (!text.empty()) stdout_line_open = text.back() != '\n';
}

/// A bad command line: reported on one line, exit code 2.
struct UsageError : specdec::Error {
  using specdec::Error::Error;
};

constexpr std::size_t kMaxContext = std::size_t{1} << 17;  // 131072 positions: 4.5 GB of f16 cache for SmolLM2

struct Args {
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string prompt = "The capital of France is";
  bool chat = false;
  std::string draft = "ngram";
  std::optional<std::size_t> k;
  bool adaptive = false;
  std::size_t max_tokens = 128;
  SamplingParams sampling{.temperature = 0.0f};
  std::string policy = "rejection";
  std::uint64_t seed = 0;
  std::size_t threads = 1;
  llama::WeightFormat format = llama::WeightFormat::quantized_dot;
  llama::KvFormat kv_format = llama::LoadOptions{}.kv_format;
  std::size_t max_context = 4096;
  bool compare = false;
  bool json = false;
  bool help = false;  // --help: print the usage and nothing else
  std::set<std::string, std::less<>> given;  // the flags on the command line
};

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range && end == text.data() + text.size())
    throw UsageError(std::string(flag) + " is out of range, got '" + std::string(text) + "'");
  if (error != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(std::string(flag) + " expects a number, got '" + std::string(text) + "'");
  return value;
}

/// The command line's flags: a value that is one of them is a forgotten value (`--draft --k 3`), not a value.
constexpr std::string_view kFlags[] = {"--help",  "-h",          "--model",   "--prompt",  "--chat",
                                       "--draft", "--k",         "--adaptive", "--max-tokens", "--temp",
                                       "--top-k", "--top-p",     "--seed",    "--threads", "--max-context",
                                       "--compare", "--json",    "--sampling", "--format", "--kv-format"};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value");
      const std::string_view next = argv[++i];
      if (std::find(std::begin(kFlags), std::end(kFlags), next) != std::end(kFlags))
        throw UsageError(std::string(flag) + " needs a value, got the flag '" + std::string(next) + "'");
      return next;
    };
    a.given.emplace(flag);
    if (flag == "--help" || flag == "-h") {
      a.help = true;
      return a;  // the arguments after it are not read
    } else if (flag == "--model") a.model = value();
    else if (flag == "--prompt") a.prompt = value();
    else if (flag == "--chat") a.chat = true;
    else if (flag == "--draft") a.draft = value();
    else if (flag == "--k") a.k = parse_number<std::size_t>(flag, value());
    else if (flag == "--adaptive") a.adaptive = true;
    else if (flag == "--max-tokens") a.max_tokens = parse_number<std::size_t>(flag, value());
    else if (flag == "--temp") a.sampling.temperature = parse_number<float>(flag, value());
    else if (flag == "--top-k") a.sampling.top_k = parse_number<std::size_t>(flag, value());
    else if (flag == "--top-p") a.sampling.top_p = parse_number<float>(flag, value());
    else if (flag == "--seed") a.seed = parse_number<std::uint64_t>(flag, value());
    else if (flag == "--threads") a.threads = parse_number<std::size_t>(flag, value());
    else if (flag == "--max-context") a.max_context = parse_number<std::size_t>(flag, value());
    else if (flag == "--compare") a.compare = true;
    else if (flag == "--json") a.json = true;
    else if (flag == "--sampling") {
      a.policy = value();
      if (a.policy != "rejection" && a.policy != "coupled")
        throw UsageError("--sampling expects rejection or coupled, got '" + a.policy + "'");
    } else if (flag == "--format") {
      const std::string_view f = value();
      bool known = false;
      for (auto format : {llama::WeightFormat::f32, llama::WeightFormat::bf16, llama::WeightFormat::bf16_dot,
                          llama::WeightFormat::quantized, llama::WeightFormat::quantized_dot})
        if (llama::to_string(format) == f) a.format = format, known = true;
      if (!known)
        throw UsageError("--format expects f32, bf16, bf16_dot, quantized or quantized_dot, got '" + std::string(f) + "'");
    } else if (flag == "--kv-format") {
      const std::string_view f = value();
      const auto kv_format = llama::kv_format_from_string(f);
      if (!kv_format) throw UsageError("--kv-format expects f16, f32 or q8, got '" + std::string(f) + "'");
      a.kv_format = *kv_format;
    } else {
      throw UsageError("unknown argument '" + std::string(flag) + "' (see --help)");
    }
  }
  if (a.threads == 0 || a.threads > 256) throw UsageError("--threads must be in 1..256, got " + std::to_string(a.threads));
  if (a.k && (*a.k == 0 || *a.k > 64))  // plain decoding is --draft none
    throw UsageError("--k must be in 1..64, got " + std::to_string(*a.k));
  if (a.max_context == 0 || a.max_context > kMaxContext)
    throw UsageError("--max-context must be in 1.." + std::to_string(kMaxContext) + ", got " + std::to_string(a.max_context));
  validate(a.sampling);  // temperature and top_p ranges, as specdec::Error
  return a;
}

/// What the user asked for with --draft.
struct DraftSpec {
  enum class Kind { none, ngram, early_exit, model } kind = Kind::ngram;
  std::size_t n = PromptLookupDraft::kDefaultMaxNgram;  // ngram: longest n-gram; early-exit: layers
  std::string path;        // model
};

/// Checks what needs no model (the syntax, the numbers, that a draft model's file exists), before the target
/// loads; check_early_exit() checks L against the target's layers after.
DraftSpec parse_draft(const std::string& text) {
  DraftSpec d;
  if (text == "none") d.kind = DraftSpec::Kind::none;
  else if (text == "ngram") d.kind = DraftSpec::Kind::ngram;
  else if (text.starts_with("ngram:")) {
    d.n = parse_number<std::size_t>("--draft ngram:N", std::string_view(text).substr(6));
    if (d.n == 0 || d.n > 16) throw UsageError("--draft ngram:N needs N in 1..16, got " + std::to_string(d.n));
  } else if (text.starts_with("early-exit:")) {
    d.kind = DraftSpec::Kind::early_exit;
    d.n = parse_number<std::size_t>("--draft early-exit:L", std::string_view(text).substr(11));
    if (d.n == 0) throw UsageError("--draft early-exit:L needs L of 1 or more, got 0");
  } else {
    std::error_code error;  // set where the path cannot be looked at (permissions): the file's open then says why
    if (!std::filesystem::exists(text, error) && !error)  // a mistyped kind reads better so than as a missing file
      throw UsageError("--draft expects none, ngram, ngram:N, early-exit:L or the path of a GGUF file, got '" + text +
                       "' (no such file)");
    d.kind = DraftSpec::Kind::model;
    d.path = text;
  }
  return d;
}

void check_early_exit(const DraftSpec& d, std::size_t target_layers) {
  if (d.kind != DraftSpec::Kind::early_exit) return;
  if (target_layers < 2)
    throw UsageError("--draft early-exit:L needs a model of 2 layers or more, this one has " + std::to_string(target_layers));
  if (d.n >= target_layers)
    throw UsageError("--draft early-exit:L needs L in 1.." + std::to_string(target_layers - 1) + ", got " + std::to_string(d.n));
}

/// The flags given that change nothing in this run (llama.cpp ignores such flags without a word), each with why.
std::vector<std::string> unused_flags(const Args& a, DraftSpec::Kind draft) {
  std::vector<std::string> out;
  const auto note = [&](std::initializer_list<const char*> flags, const char* why) {
    for (const char* flag : flags)
      if (a.given.contains(flag)) out.push_back(std::string(flag) + " has no effect " + why);
  };
  if (draft == DraftSpec::Kind::none) note({"--k", "--adaptive"}, "with --draft none (plain decoding)");
  if (a.sampling.temperature == 0.0f) note({"--sampling", "--seed", "--top-k", "--top-p"}, "at --temp 0 (greedy)");
  return out;
}

/// One finished run: the generation and its text.
struct Run {
  Generation generation;
  std::string text;
};

/// Streams text to stdout when asked to, and collects it.
struct TextSink {
  const Tokenizer& tokenizer;
  bool stream;
  llama::TextStream decoder{tokenizer};
  std::string text{};
  void push(Token t) {
    const std::string piece = decoder.push(t);
    text += piece;
    if (stream) stream_out(piece);
  }
  void finish() {
    const std::string rest = decoder.flush();
    text += rest;
    if (stream) stream_out(rest);
  }
};

template <class Generate>
Run run_one(const Tokenizer& tokenizer, bool stream, Generate&& generate) {
  TextSink sink{tokenizer, stream};
  Run run;
  run.generation = generate([&](Token t) { sink.push(t); return true; });
  sink.finish();
  run.text = std::move(sink.text);
  return run;
}

// One forward before any timed run, then forgotten: a process's first forward is slower (cold caches, the
// pool's first wake), and after a one-token prompt (no prompt processing) it was timed as decoding in the
// first run only: --compare then reported plain decoding as 0.4x of itself.
template <class M>
void warm_up(M& model, const std::vector<Token>& prompt) {
  model.forward(std::span(prompt).first(1));
  model.truncate(0);
}

/// Runs the speculative decoder for one draft model, with the policy and draft-length choice from the args.
template <class Draft>
Run run_speculative(Draft& draft, LlamaModel& target, const Args& args, const std::vector<Token>& prompt,
                    GenerateOptions options, const Tokenizer& tokenizer, bool stream) {
  const auto with = [&](auto acceptance) {
    const auto go = [&](auto length_policy) {
      SpeculativeDecoder decoder(draft, target, acceptance, length_policy);
      return run_one(tokenizer, stream, [&](auto on_token) {
        options.on_token = on_token;
        return decoder.generate(prompt, options);
      });
    };
    return args.adaptive ? go(AdaptiveDraftLength{}) : go(FixedDraftLength{});
  };
  if (args.sampling.temperature == 0.0f) return with(Greedy{});
  if (args.policy == "coupled") return with(CoupledSampling{args.sampling});
  return with(RejectionSampling{args.sampling});
}

Run run_plain(LlamaModel& target, const Args& args, const std::vector<Token>& prompt, GenerateOptions options,
              const Tokenizer& tokenizer, bool stream) {
  const auto with = [&](auto acceptance) {
    return run_one(tokenizer, stream, [&](auto on_token) {
      options.on_token = on_token;
      return generate_autoregressive(target, acceptance, prompt, options);
    });
  };
  if (args.sampling.temperature == 0.0f) return with(Greedy{});
  if (args.policy == "coupled") return with(CoupledSampling{args.sampling});
  return with(RejectionSampling{args.sampling});
}

template <class T>
std::string json_array(const std::vector<T>& values) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  out << ']';
  return out.str();
}

/// The "stats" fields (and text/tokens for the plain run).
std::string json_stats(const DecodeStats& s) {
  std::ostringstream out;
  out.precision(6);
  out << "\"rounds\":" << s.rounds << ",\"drafted\":" << s.drafted_tokens << ",\"accepted\":" << s.accepted_tokens
      << ",\"acceptance_rate\":" << s.acceptance_rate() << ",\"target_calls\":" << s.target_forward_calls
      << ",\"draft_calls\":" << s.draft_forward_calls << ",\"seconds\":" << (s.total_seconds - s.prefill_seconds)
      << ",\"prefill_seconds\":" << s.prefill_seconds << ",\"tokens_per_second\":" << s.tokens_per_second()
      << ",\"tokens_per_target_call\":" << s.tokens_per_target_call() << ",\"draft_seconds\":" << s.draft_seconds
      << ",\"target_seconds\":" << s.target_seconds << ",\"accepted_at\":" << json_array(s.accepted_at)
      << ",\"drafted_at\":" << json_array(s.drafted_at) << ",\"draft_lengths\":" << json_array(s.draft_lengths);
  return out.str();
}

void print_summary(const char* label, const DecodeStats& s) {
  std::fprintf(stderr, "%s: %zu tokens in %.2f s, %.1f tokens/s", label, s.generated_tokens,
               s.total_seconds - s.prefill_seconds, s.tokens_per_second());
  if (s.drafted_tokens > 0)
    std::fprintf(stderr, ", acceptance %.1f%%, %.2f tokens per target call", 100.0 * s.acceptance_rate(),
                 s.tokens_per_target_call());
  else if (std::string_view(label) != "plain")  // the draft never proposed (k stayed at 0, no prompt match, ...)
    std::fprintf(stderr, ", nothing drafted");
  std::fprintf(stderr, " (prompt: %zu tokens, %.2f s)\n", s.prompt_tokens, s.prefill_seconds);
}

/// The prompt's tokens: every byte of --prompt has a token, it is not empty, and it fits --max-context with
/// --max-tokens. Throws UsageError naming what does not.
std::vector<Token> encode_prompt(const Tokenizer& tokenizer, const Args& args, const std::string& prompt_text) {
  const std::vector<Token> prompt = tokenizer.encode(prompt_text);
  // The tokenizer drops a byte it has no token for (as llama.cpp does); the model would not see the prompt given.
  if (const auto at = tokenizer.first_dropped_byte(args.prompt)) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(args.prompt[*at])));
    throw UsageError(std::string("--prompt byte ") + hex + " at offset " + std::to_string(*at) +
                     " has no token in this vocabulary (the tokenizer would drop it)");
  }
  if (prompt.empty()) throw UsageError("--prompt is empty");
  // The model holds the prompt and every new token but the last, which is never fed back (as the decoder's own
  // limit counts it). Written without wrap-around.
  if (prompt.size() > args.max_context || (args.max_tokens > 0 && args.max_tokens - 1 > args.max_context - prompt.size()))
    throw UsageError("prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens (" +
                     std::to_string(args.max_tokens) + ") exceeds --max-context " + std::to_string(args.max_context) +
                     " (the model holds the prompt and all new tokens but the last)");
  return prompt;
}

/// The model of --draft PATH, opened and checked against the target's vocabulary before anything is printed (a bad
/// file is an error, not a half-run); null for the other drafts.
std::unique_ptr<LlamaModel> load_draft_model(const DraftSpec& draft_spec, const Args& args, const Tokenizer& tokenizer,
                                             const LlamaModel& target) {
  if (draft_spec.kind != DraftSpec::Kind::model) return nullptr;
  const gguf::File draft_file = gguf::File::open(draft_spec.path);
  try {
    llama::check_same_vocabulary(Tokenizer::from_gguf(draft_file), tokenizer);
  } catch (const specdec::Error& e) {
    throw specdec::Error("--draft '" + draft_spec.path + "': " + e.what());
  }
  return std::make_unique<LlamaModel>(llama::LlamaWeights::load(draft_file, args.format), args.max_context,
                                      target.pool(), args.kv_format);
}

/// Warnings on stderr for settings that run but may not do what was meant.
void warn_about_settings(const Args& args, const DraftSpec& draft_spec, const LlamaModel& target,
                         std::size_t prompt_size) {
  // Positions past the trained context run (RoPE extends to any position), but the model was not trained on
  // them: said once on stderr, after the checks of the arguments and files (llama.cpp warns when its context is
  // larger).
  if (const std::size_t trained = target.config().context_length;
      trained > 0 && args.max_tokens > 0 && prompt_size + args.max_tokens - 1 > trained)  // as --max-context
    std::fprintf(stderr,
                 "specdec-generate: warning: prompt (%zu tokens) + --max-tokens (%zu) reach past the model's trained "
                 "context of %zu positions; text beyond it may lose coherence\n",
                 prompt_size, args.max_tokens, trained);
  for (const std::string& unused : unused_flags(args, draft_spec.kind))
    std::fprintf(stderr, "specdec-generate: warning: %s\n", unused.c_str());
  if (const unsigned cores = std::thread::hardware_concurrency(); cores > 0 && args.threads > cores)
    std::fprintf(stderr,
                 "specdec-generate: warning: --threads %zu is more than the %u hardware threads here; the workers "
                 "then take turns on the cores, which is much slower\n",
                 args.threads, cores);
}

/// The main run: speculative decoding with the chosen draft, or plain decoding with --draft none.
/// requires: draft_model is load_draft_model's, not null, for --draft PATH.
Run run_main_decoding(const DraftSpec& draft_spec, LlamaModel& target, LlamaModel* draft_model, const Args& args,
                      const std::vector<Token>& prompt, const GenerateOptions& options, const Tokenizer& tokenizer,
                      bool stream) {
  switch (draft_spec.kind) {
    case DraftSpec::Kind::none:
      return run_plain(target, args, prompt, options, tokenizer, stream);
    case DraftSpec::Kind::ngram: {
      PromptLookupDraft draft(target.vocab_size(), draft_spec.n, 1);
      return run_speculative(draft, target, args, prompt, options, tokenizer, stream);
    }
    case DraftSpec::Kind::early_exit: {
      llama::EarlyExitDraft draft(target, draft_spec.n);
      warm_up(draft, prompt);  // its own caches warmed too, as the target's and a draft model's in run_main
      return run_speculative(draft, target, args, prompt, options, tokenizer, stream);
    }
    case DraftSpec::Kind::model:
      return run_speculative(*draft_model, target, args, prompt, options, tokenizer, stream);
  }
  throw std::logic_error("unknown draft kind");  // every kind returns above
}

/// The runs printed: one JSON object on stdout with --json, else a summary of each on stderr.
void print_results(const Args& args, std::size_t prompt_size, const char* label, const Run& main_run,
                   const std::optional<Run>& plain) {
  const auto& s = main_run.generation.stats;
  const double speedup = plain && plain->generation.stats.tokens_per_second() > 0
                             ? s.tokens_per_second() / plain->generation.stats.tokens_per_second() : 0.0;
  const bool identical = plain && plain->generation.tokens == main_run.generation.tokens;

  if (args.json) {
    std::cout << "{\"text\":" << json_string(main_run.text) << ",\"tokens\":" << json_array(main_run.generation.tokens)
              << ",\"prompt_tokens\":" << prompt_size << ",\"draft\":" << json_string(args.draft)
              << ",\"format\":" << json_string(llama::to_string(args.format))
              << ",\"kv_format\":" << json_string(llama::to_string(args.kv_format)) << ",\"stats\":{" << json_stats(s) << "}";
    if (plain)
      std::cout << ",\"plain\":{\"text\":" << json_string(plain->text) << ",\"tokens\":" << json_array(plain->generation.tokens)
                << "," << json_stats(plain->generation.stats) << "},\"speedup\":" << speedup
                << ",\"identical\":" << (identical ? "true" : "false");
    std::cout << "}\n";
  } else {
    print_summary(label, s);
    if (plain) {
      print_summary("plain", plain->generation.stats);
      std::fprintf(stderr, "speedup: %.2fx, tokens identical: %s\n", speedup, identical ? "yes" : "no");
    }
  }
}

int run_main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  if (args.help) {
    std::cout << kUsage;
    check_stdout();
    return 0;
  }
  const DraftSpec draft_spec = parse_draft(args.draft);
  const gguf::File file = gguf::File::open(args.model);
  const Tokenizer tokenizer = Tokenizer::from_gguf(file);
  LlamaModel target(llama::LlamaWeights::load(file, args.format), args.max_context,
                    std::make_shared<llama::ThreadPool>(args.threads), args.kv_format);
  check_early_exit(draft_spec, target.config().layers);

  const std::string prompt_text = args.chat ? Tokenizer::chat_prompt(args.prompt) : args.prompt;
  const std::vector<Token> prompt = encode_prompt(tokenizer, args, prompt_text);
  const GenerateOptions options{.max_new_tokens = args.max_tokens,
                                .draft_length = args.k.value_or(args.adaptive ? 8 : 4),
                                .stop_tokens = tokenizer.stop_tokens(),
                                .seed = args.seed};
  const std::unique_ptr<LlamaModel> draft_model = load_draft_model(draft_spec, args, tokenizer, target);
  warn_about_settings(args, draft_spec, target, prompt.size());
  warm_up(target, prompt);
  if (draft_model) warm_up(*draft_model, prompt);
  const bool stream = !args.json;
  if (stream) stream_out(prompt_text);
  const Run main_run =
      run_main_decoding(draft_spec, target, draft_model.get(), args, prompt, options, tokenizer, stream);
  if (stream) stream_out("\n");  // before the summary on stderr, which shares the terminal

  std::optional<Run> plain;
  if (args.compare) plain = run_plain(target, args, prompt, options, tokenizer, false);
  print_results(args, prompt.size(), draft_spec.kind == DraftSpec::Kind::none ? "plain" : "speculative", main_run,
                plain);
  check_stdout();
  return 0;
}

/// Reports an error on one line of stderr, after ending a line that the streamed text left open.
int report(std::string_view prefix, const char* message) {
  if (stdout_line_open) std::cout << "\n" << std::flush;
  std::cerr << "specdec-generate: " << prefix << specdec::detail::escape_controls(message) << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const specdec::Error& e) {  // UsageError too
    return report("", e.what());
  } catch (const std::exception& e) {
    return report("unexpected error: ", e.what());
  }
}

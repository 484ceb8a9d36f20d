// End-to-end benchmarks on SmolLM2: plain vs speculative decoding over the task set in benchmarks/tasks/,
// for each draft and draft length, greedy and sampled, plus the cost model's measurements.
//
//   BM_Cost/<kind>/target/w<w>   t_v(w): one target forward of w positions at the kind's cost context (mean
//                                prompt + half the token limit; BM_Plain's mean_decoding_context is the context
//                                the decoding forwards saw); all widths are sampled in turn, so that their
//                                ratios do not absorb the machine's drift between them
//   BM_Cost/<kind>/draft/<draft> t_d: one draft step at that context; counter catch_up_seconds, t_u: one
//                                catch-up call of one token (through the draft's append() where it has one)
//   BM_Cost/clock/start, /end    the core clock (GHz) before and after all runs: how far the machine drifted
//   BM_Stages/<kind>             where a target forward of w positions spends its time at that context, by stage
//                                (weight products of the blocks, attention, output head, the rest), w = 1..k+1
//   BM_E2E/<kind>/<mode>/plain   plain decoding of every task of a kind (the baseline; runs first); counters
//                                tokens_per_second, task_tokens_{min,mean,max}, repeated_4grams_{mean,max},
//                                mean_decoding_context and cost_context
//   BM_E2E/<kind>/<mode>/<draft>/k<k> and .../adaptive
//
// Counters of an E2E run: tokens_per_second, alpha (acceptance), tau (tokens per round), acc<i> (acceptance
// at draft position i), speedup (vs plain decoding of the same tasks, run right after each task:
// plain_tokens_per_second), predicted (the cost model S = tau * t_AR / (d * t_d + u * t_u + t_v(w)), d the
// draft steps and u the draft's catch-up calls per round, t_u one catch-up of one token, and t_v(w) averaged over
// the rounds' verify widths, with t_AR, t_d, t_u and t_v sampled between the configuration's own tasks, so in
// the same minutes as the runs: counters t_ar, t_d, t_u, catch_ups_per_round), predicted_table (the
// same with the BM_Cost table measured before all runs), predicted_in_run (the same with the runs' own model-call
// times: plain decoding's mean forward as t_AR, the speculative rounds' mean draft + verify time), identical
// (1 when every task's tokens equal plain decoding's; -1 where only the distribution is the same), and the
// cost model's terms in the runs against their samples: in_run_t_ar (the paired plain runs' mean forward over
// t_AR), in_run_verify (the rounds' verify calls over t_v at their widths) and in_run_draft (the rounds' draft
// calls over d * t_d + u * t_u; absent without draft calls), each 1 where the runs' calls took what the samples
// did.
//
// Environment: SPECDEC_MODEL (GGUF path), SPECDEC_THREADS (1), SPECDEC_BENCH_TOKENS (256),
// SPECDEC_BENCH_KS ("1,2,3,4,5,6,7,8"), SPECDEC_BENCH_DRAFTS ("ngram,early-exit:4,early-exit:10"; a draft may
// carry its own k list, "early-exit:6@1+2+4"),
// SPECDEC_BENCH_MODES ("greedy,sampled"), SPECDEC_BENCH_KINDS ("grounded,chat,code"),
// SPECDEC_BENCH_DRAFT_MODEL (a second GGUF, added as draft "model"), SPECDEC_BENCH_REPEATS (cost samples, 15),
// SPECDEC_BENCH_SEEDS (seeds per task in BM_Interleaved's sampled runs, 3),
// SPECDEC_FORMAT (the weight format, default quantized_dot), SPECDEC_KV_FORMAT (the KV cache's element, default f16).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <specdec/llama/llama.hpp>
#include <specdec/specdec.hpp>

#include "bench_env.hpp"

namespace {

using namespace specdec;
namespace fs = std::filesystem;

using bench::env_count;
std::string env(const char* name, const std::string& fallback) { return bench::env_text(name, fallback); }

/// The task kinds: folders of benchmarks/tasks/, in the order they run.
constexpr std::array<const char*, 3> kTaskKinds = {"grounded", "chat", "code"};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

struct Task {
  std::string kind, name;
  std::vector<Token> prompt;
};

/// The in-memory weight format: SPECDEC_FORMAT (f32, bf16, bf16_dot, quantized, quantized_dot), default quantized_dot.
llama::WeightFormat format() {
  const std::string name = env("SPECDEC_FORMAT", "quantized_dot");
  for (auto f : {llama::WeightFormat::f32, llama::WeightFormat::bf16, llama::WeightFormat::bf16_dot,
                 llama::WeightFormat::quantized, llama::WeightFormat::quantized_dot})
    if (llama::to_string(f) == name) return f;
  detail::fail("SPECDEC_FORMAT '", name, "' is not a weight format");
}

/// The KV cache's element: SPECDEC_KV_FORMAT (f16, f32, q8), default the library's (f16).
llama::KvFormat kv_format() {
  const std::string name = env("SPECDEC_KV_FORMAT", llama::to_string(llama::LoadOptions{}.kv_format));
  if (const auto f = llama::kv_format_from_string(name)) return *f;
  detail::fail("SPECDEC_KV_FORMAT '", name, "' is not f16, f32 or q8");
}

/// Everything loaded once: the model, its tokenizer, the tasks, the plain baselines.
struct Bench {
  gguf::File file;
  llama::Tokenizer tokenizer;
  llama::LlamaModel target;
  std::unique_ptr<llama::LlamaModel> second_draft;
  std::vector<Task> tasks;
  std::size_t max_new_tokens;
  std::map<std::string, std::size_t> cost_context;                // kind -> context at which costs are measured
  std::map<std::string, std::map<std::size_t, double>> t_verify;  // kind -> width -> seconds
  std::map<std::string, std::map<std::string, double>> t_draft;   // kind -> draft -> seconds per step
  std::map<std::string, std::map<std::string, double>> t_catch_up;  // kind -> draft -> seconds per catch-up call
  std::map<std::string, std::vector<std::vector<Token>>> plain_tokens;  // kind/mode -> per task
  std::map<std::string, double> plain_rate;                             // kind/mode -> tokens/s

  static std::string model_path() { return env("SPECDEC_MODEL", SPECDEC_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"); }

  static Bench& get() {
    static Bench bench;
    return bench;
  }

 private:
  Bench()
      : file(gguf::File::open(model_path())),
        tokenizer(llama::Tokenizer::from_gguf(file)),
        target(llama::LlamaWeights::load(file, format()), 4096,
               std::make_shared<llama::ThreadPool>(env_count("SPECDEC_THREADS", 1, 1, 1024)), kv_format()),
        max_new_tokens(env_count("SPECDEC_BENCH_TOKENS", 256, 1, 3072)) {
    if (const std::string path = env("SPECDEC_BENCH_DRAFT_MODEL", ""); !path.empty()) {
      const gguf::File draft_file = gguf::File::open(path);
      llama::check_same_vocabulary(llama::Tokenizer::from_gguf(draft_file), tokenizer);
      second_draft = std::make_unique<llama::LlamaModel>(llama::LlamaWeights::load(draft_file, format()),
                                                         4096, target.pool(), kv_format());
    }
    const fs::path root = SPECDEC_SOURCE_DIR "/benchmarks/tasks";
    for (const std::string kind : kTaskKinds) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(root / kind))
        if (entry.path().extension() == ".txt") files.push_back(entry.path());
      if (files.empty()) throw std::runtime_error("no task files (*.txt) in " + (root / kind).string());
      std::sort(files.begin(), files.end());
      for (const auto& path : files) {
        std::ifstream in(path);
        std::stringstream text;
        text << in.rdbuf();
        // Every task is a request in the chat template; the file's final newline is not part of it.
        std::string request = text.str();
        request.erase(request.find_last_not_of(" \t\r\n") + 1);
        if (request.empty()) throw std::runtime_error("task file " + path.string() + " is empty");
        const std::string prompt = llama::Tokenizer::chat_prompt(request);
        tasks.push_back({kind, path.stem().string(), tokenizer.encode(prompt)});
        cost_context[kind] += tasks.back().prompt.size();
      }
      cost_context[kind] = cost_context[kind] / files.size() + max_new_tokens / 2;
    }
  }
};

SamplingParams sampled_params() { return {.temperature = 0.7f, .top_p = 0.95f}; }

/// Seeds per task in the sampled interleaved comparison: SPECDEC_BENCH_SEEDS, default 3.
std::size_t sampled_seeds() {
  return env_count("SPECDEC_BENCH_SEEDS", 3, 1, 1000);
}

/// Cost samples per width for the cost table: SPECDEC_BENCH_REPEATS, default 15.
std::size_t default_repeats() { return env_count("SPECDEC_BENCH_REPEATS", 15, 1, 10000); }

/// Fills `model` with `context` tokens (the tasks' prompts, then newlines), without logits where the model can
/// (append); returns them followed by `width` more tokens to time forward calls of up to `width` positions with.
template <class M>
std::vector<Token> fill_context(M& model, std::size_t context, std::size_t width) {
  std::vector<Token> filler;
  for (const auto& task : Bench::get().tasks) filler.insert(filler.end(), task.prompt.begin(), task.prompt.end());
  filler.resize(context + width, 198);
  model.truncate(0);
  const std::span<const Token> prefix(filler.data(), context);
  if constexpr (requires { model.append(prefix); }) model.append(prefix);
  else model.forward(prefix);
  return filler;
}

/// The median of some samples (the upper one of the middle two for an even count). requires: !v.empty().
double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// Median seconds of `forward(w tokens)` for each w in `widths` on a model holding `context` tokens, rolled back
/// after each call; the widths are sampled in turn, so that the machine's drift cannot bend their ratios.
/// `between()` runs untimed before each sample: for a draft, a target step, so that the draft finds the caches
/// as it does while decoding (the target's weights stream through them between draft steps).
/// A one-position forward (t_AR) is timed right after an untimed one, as plain decoding runs them back to back:
/// timed right after the widest pass of the turn, as before, its median was 0.5-10% (typically 4%) above that,
/// and t_AR times plain decoding's tokens/s (1 at most: plain decoding also samples) averaged 1.03-1.05 over a
/// subset run or a report, 0.97-0.99 now; the prediction was inflated with it.
/// The context is filled without logits where the model can (append): a forward over the whole context returns
/// [context, vocab] logits (48 MB at 245 positions), and the first call after freeing them took 2.5x as long.
/// With `logits` false the calls are append()s where the model has one (a draft's catch-up, as the decoder
/// makes it).
template <class M, class Between>
std::vector<double> median_forward_seconds(M& model, std::size_t context, const std::vector<std::size_t>& widths,
                                           Between&& between, std::size_t repeats = default_repeats(),
                                           bool logits = true) {
  const std::vector<Token> filler = fill_context(model, context, *std::max_element(widths.begin(), widths.end()));
  constexpr bool can_append = requires(std::span<const Token> tokens) { model.append(tokens); };
  const auto step = [&](std::size_t width) {
    between();
    const std::span<const Token> tokens(filler.data() + context, width);
    const auto start = detail::Clock::now();
    if (!logits && can_append) {
      if constexpr (can_append) model.append(tokens);
    } else {
      benchmark::DoNotOptimize(model.forward(tokens).data());
    }
    const double seconds = detail::seconds_since(start);
    model.truncate(context);
    return seconds;
  };
  std::vector<std::vector<double>> samples(widths.size());
  for (std::size_t r = 0; r < repeats; ++r)
    for (std::size_t i = 0; i < widths.size(); ++i) {
      if (widths[i] == 1) step(1);  // untimed: a one-position pass follows a one-position pass
      samples[i].push_back(step(widths[i]));
    }
  model.truncate(0);
  std::vector<double> medians;
  for (auto& v : samples) medians.push_back(median(std::move(v)));
  return medians;
}

/// t_d: the median seconds of one draft step at the kind's cost context, with a target step run before each
/// sample, so that the draft finds the caches as it does while decoding. With `logits` false, t_u: one catch-up
/// call of one token (after a fully accepted round; after rounds without drafting it feeds more).
template <class Draft>
double draft_step_seconds(Draft& draft, const std::string& kind, std::size_t repeats = default_repeats(),
                          bool logits = true) {
  Bench& bench = Bench::get();
  const Token one[1] = {198};
  const auto target_step = [&] {
    bench.target.forward(one);
    bench.target.truncate(0);
  };
  return median_forward_seconds(draft, bench.cost_context.at(kind), {1}, target_step, repeats, logits)[0];
}

/// A benchmark draft's name parsed: "ngram" or "ngram:N" (prompt lookup, n-grams up to N), "early-exit:L" (the
/// target's first L layers) or "model" (SPECDEC_BENCH_DRAFT_MODEL). Throws naming the draft otherwise.
struct DraftName {
  enum class Kind { ngram, early_exit, model } kind;
  std::size_t size = 0;  // N or L

  explicit DraftName(const std::string& name) {
    if (name == "ngram") {
      kind = Kind::ngram, size = PromptLookupDraft::kDefaultMaxNgram;
    } else if (name.starts_with("ngram:")) {
      kind = Kind::ngram, size = bench::parse_count(name.substr(6), "draft '" + name + "': n-gram length", 1, 64);
    } else if (name.starts_with("early-exit:")) {
      kind = Kind::early_exit, size = bench::parse_count(name.substr(11), "draft '" + name + "': layers", 1, 1024);
    } else if (name == "model" && !env("SPECDEC_BENCH_DRAFT_MODEL", "").empty()) {
      kind = Kind::model;
    } else {
      detail::fail("unknown benchmark draft '", name, "' (ngram, ngram:N, early-exit:L, or model with SPECDEC_BENCH_DRAFT_MODEL)");
    }
  }
};

/// Calls `f(draft)` with the draft model a name stands for.
template <class F>
void with_draft(const std::string& name, F&& f) {
  Bench& bench = Bench::get();
  const DraftName parsed(name);
  if (parsed.kind == DraftName::Kind::ngram) {
    PromptLookupDraft draft(bench.target.vocab_size(), parsed.size, 1);
    f(draft);
  } else if (parsed.kind == DraftName::Kind::early_exit) {
    llama::EarlyExitDraft draft(bench.target, parsed.size);
    f(draft);
  } else {
    f(*bench.second_draft);
  }
}

/// Medians of t_v(w) for w = 1..max_width at the kind's context.
void measure_verify_costs(const std::string& kind, std::size_t max_width) {
  Bench& bench = Bench::get();
  std::vector<std::size_t> widths(max_width);
  std::iota(widths.begin(), widths.end(), std::size_t{1});
  const auto medians = median_forward_seconds(bench.target, bench.cost_context.at(kind), widths, [] {});
  for (std::size_t w = 1; w <= max_width; ++w) bench.t_verify[kind][w] = medians[w - 1];
}

void BM_CostTarget(benchmark::State& state, const std::string& kind, std::size_t width, std::size_t max_width) {
  Bench& bench = Bench::get();
  if (width > 1 && !bench.t_verify.count(kind))  // w1 measures every width
    detail::fail("BM_Cost/", kind, "/target/w", width, " needs BM_Cost/", kind, "/target/w1 to run first");
  for (auto _ : state) {
    if (width == 1) measure_verify_costs(kind, max_width);
    state.SetIterationTime(bench.t_verify.at(kind).at(width));
  }
  const double seconds = bench.t_verify.at(kind).at(width);
  state.counters["seconds"] = seconds;
  state.counters["width"] = static_cast<double>(width);
  state.counters["context"] = static_cast<double>(bench.cost_context.at(kind));
}

/// Where a target forward of w positions spends its time at the kind's cost context, for w = 1..max_width
/// sampled in turn (llama::ForwardProfile), w = 1 right after an untimed one-position forward as for t_AR:
/// counters w<w>_<stage> in ms, each the median over the samples (so the stages need not add up to the total).
void BM_Stages(benchmark::State& state, const std::string& kind, std::size_t max_width) {
  Bench& bench = Bench::get();
  const std::size_t context = bench.cost_context.at(kind);
  using Stage = double llama::ForwardProfile::*;
  const std::pair<const char*, Stage> stages[] = {{"block_products", &llama::ForwardProfile::block_products},
                                                  {"attention", &llama::ForwardProfile::attention},
                                                  {"output_head", &llama::ForwardProfile::output_head},
                                                  {"other", &llama::ForwardProfile::other}};
  std::vector<std::vector<llama::ForwardProfile>> samples(max_width + 1);
  for (auto _ : state) {
    const std::vector<Token> filler = fill_context(bench.target, context, max_width);
    for (std::size_t r = 0; r < default_repeats(); ++r)
      for (std::size_t w = 1; w <= max_width; ++w) {
        if (w == 1) {  // untimed, as for t_AR: a one-position pass follows a one-position pass
          bench.target.forward(std::span<const Token>(filler.data() + context, 1));
          bench.target.truncate(context);
        }
        llama::ForwardProfile profile;
        bench.target.set_profile(&profile);
        benchmark::DoNotOptimize(bench.target.forward(std::span<const Token>(filler.data() + context, w)).data());
        bench.target.set_profile(nullptr);
        bench.target.truncate(context);
        samples[w].push_back(profile);
      }
    bench.target.truncate(0);
  }
  for (std::size_t w = 1; w <= max_width; ++w) {
    const auto of = [&](auto&& get) {
      std::vector<double> v;
      for (const auto& p : samples[w]) v.push_back(get(p));
      return median(std::move(v)) * 1e3;
    };
    const std::string prefix = "w" + std::to_string(w) + "_";
    for (const auto& [name, stage] : stages)
      state.counters[prefix + name] = of([stage](const llama::ForwardProfile& p) { return p.*stage; });
    state.counters[prefix + "total"] = of([](const llama::ForwardProfile& p) { return p.total(); });
  }
  state.counters["context"] = static_cast<double>(context);
  state.counters["max_width"] = static_cast<double>(max_width);
}

void BM_CostDraft(benchmark::State& state, const std::string& kind, const std::string& name) {
  Bench& bench = Bench::get();
  if (!bench.t_verify.count(kind))  // for c = t_d / t_v(1)
    detail::fail("BM_Cost/", kind, "/draft/", name, " needs BM_Cost/", kind, "/target/w1 to run first");
  double seconds = 0, catch_up = 0;
  for (auto _ : state) {
    with_draft(name, [&](auto& draft) {
      seconds = draft_step_seconds(draft, kind);
      catch_up = draft_step_seconds(draft, kind, default_repeats(), false);
    });
    state.SetIterationTime(seconds);
  }
  bench.t_draft[kind][name] = seconds;
  bench.t_catch_up[kind][name] = catch_up;
  state.counters["seconds"] = seconds;
  state.counters["catch_up_seconds"] = catch_up;
  state.counters["c"] = seconds / bench.t_verify.at(kind).at(1);
}

/// Read bandwidth of one thread: the best of a few passes summing a 512 MiB buffer.
void BM_CostBandwidth(benchmark::State& state) {
  // Huge pages, as the packed weights use.
  std::vector<float, llama::detail::HugePageAllocator<float>> buffer((std::size_t{512} << 20) / sizeof(float), 1.0f);
  double best = 1e9;
  for (auto _ : state) {
    for (int pass = 0; pass < 5; ++pass) {
      const auto start = detail::Clock::now();
      const Eigen::Map<const Eigen::ArrayXf> values(buffer.data(), static_cast<Eigen::Index>(buffer.size()));
      benchmark::DoNotOptimize(values.sum());
      best = std::min(best, detail::seconds_since(start));
    }
    state.SetIterationTime(best);
  }
  state.counters["GB_per_s"] = static_cast<double>(buffer.size() * sizeof(float)) / best / 1e9;
}

/// The core's clock, roughly: a chain of dependent one-cycle additions. Measured at the start and at the end of
/// the run, to tell a change of clock from a change in memory contention when the machine's speed drifts.
void BM_CostClock(benchmark::State& state) {
  double best = 1e9;
  constexpr std::uint64_t steps = 200'000'000;
  for (auto _ : state) {
    for (int pass = 0; pass < 3; ++pass) {
      const auto start = detail::Clock::now();
      std::uint64_t x = 0;
      for (std::uint64_t i = 0; i < steps; ++i) {
        ++x;
#if defined(__GNUC__)
        __asm__ volatile("" : "+r"(x));  // keeps the chain: one addition per cycle, not folded away
#endif
      }
      benchmark::DoNotOptimize(x);
      best = std::min(best, detail::seconds_since(start));
    }
    state.SetIterationTime(best);
  }
  state.counters["GHz"] = static_cast<double>(steps) / best / 1e9;
}

/// Totals over the tasks of one kind.
struct Totals {
  std::size_t tokens = 0, rounds = 0, drafted = 0, accepted = 0, draft_steps = 0, catch_ups = 0;
  double seconds = 0;
  double model_seconds = 0;  // inside the target's and the draft's forward calls, prompt processing excluded
  double verify_call_seconds = 0;  // of model_seconds: inside the target's calls (the rounds' verify calls)
  std::vector<std::size_t> drafted_at, accepted_at, verify_widths;
  std::vector<std::vector<Token>> outputs;

  void add(const Generation& g) {
    const auto& s = g.stats;
    // A draft's prompt processing is one of its forward calls (when it has a prompt to process), not a step.
    const std::size_t prompt_draft_calls = s.prompt_tokens > 1 && s.draft_forward_calls > 0 ? 1 : 0;
    tokens += s.generated_tokens;
    rounds += s.rounds;
    drafted += s.drafted_tokens;
    accepted += s.accepted_tokens;
    draft_steps += s.draft_forward_calls - prompt_draft_calls - s.draft_catch_up_calls;
    catch_ups += s.draft_catch_up_calls;
    seconds += s.total_seconds - s.prefill_seconds;
    model_seconds += s.target_seconds + s.draft_seconds - s.prefill_seconds;
    verify_call_seconds += std::accumulate(s.verify_seconds.begin(), s.verify_seconds.end(), 0.0);
    drafted_at.resize(std::max(drafted_at.size(), s.drafted_at.size()));
    accepted_at.resize(drafted_at.size());
    for (std::size_t i = 0; i < s.drafted_at.size(); ++i) {
      drafted_at[i] += s.drafted_at[i];
      accepted_at[i] += s.accepted_at[i];
    }
    outputs.push_back(g.tokens);
    verify_widths.insert(verify_widths.end(), s.verify_widths.begin(), s.verify_widths.end());
  }
  double rate() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0; }
};

/// Plain decoding of one prompt in the given mode.
Generation generate_plain(const std::string& mode, std::span<const Token> prompt, const GenerateOptions& options) {
  Bench& bench = Bench::get();
  return mode == "sampled" ? generate_autoregressive(bench.target, RejectionSampling{sampled_params()}, prompt, options)
                           : generate_autoregressive(bench.target, Greedy{}, prompt, options);
}

/// Runs every task of `kind` through `generate(prompt, options)`. With `paired`, each task is also decoded
/// plainly right after, into *paired: a baseline taken at the same moments, which the machine's drift over the
/// minutes a full run takes cannot skew against the speculative run. `after_task` runs after each task.
template <class Generate>
Totals run_tasks(const std::string& kind, const std::string& mode, Generate&& generate, Totals* paired = nullptr,
                 const std::function<void(const Generation&)>& after_task = {}) {
  Bench& bench = Bench::get();
  Totals totals;
  std::uint64_t seed = 0;
  for (const auto& task : bench.tasks) {
    if (task.kind != kind) continue;
    const GenerateOptions options{.max_new_tokens = bench.max_new_tokens, .stop_tokens = bench.tokenizer.stop_tokens(),
                                  .seed = mode == "sampled" ? ++seed : 0};
    const auto g = generate(task.prompt, options);
    totals.add(g);
    if (paired) paired->add(generate_plain(mode, task.prompt, options));
    if (after_task) after_task(g);
  }
  return totals;
}

/// The share of an output's windows of 4 tokens that already occurred earlier in it: 0 for text that never
/// repeats itself, near 1 for a loop (which any draft that copies earlier text predicts, so it inflates speedups).
double repeated_4grams(const std::vector<Token>& tokens) {
  if (tokens.size() < 4) return 0.0;
  std::vector<std::array<Token, 4>> windows;
  for (std::size_t i = 0; i + 4 <= tokens.size(); ++i)
    windows.push_back({tokens[i], tokens[i + 1], tokens[i + 2], tokens[i + 3]});
  const std::size_t total = windows.size();
  std::sort(windows.begin(), windows.end());
  const auto distinct = static_cast<std::size_t>(std::unique(windows.begin(), windows.end()) - windows.begin());
  return static_cast<double>(total - distinct) / static_cast<double>(total);
}

/// The baseline every speedup divides by, so it is measured three times and the median run is kept.
void BM_Plain(benchmark::State& state, const std::string& kind, const std::string& mode) {
  Bench& bench = Bench::get();
  Totals totals;
  for (auto _ : state) {
    std::vector<Totals> runs;
    for (int repeat = 0; repeat < 3; ++repeat)
      runs.push_back(run_tasks(kind, mode, [&](std::span<const Token> prompt, const GenerateOptions& options) {
        return generate_plain(mode, prompt, options);
      }));
    std::sort(runs.begin(), runs.end(), [](const Totals& a, const Totals& b) { return a.rate() < b.rate(); });
    totals = runs[1];
    state.SetIterationTime(totals.seconds);
  }
  bench.plain_tokens[kind + "/" + mode] = totals.outputs;
  bench.plain_rate[kind + "/" + mode] = totals.rate();
  state.counters["tokens_per_second"] = totals.rate();
  state.counters["tokens"] = static_cast<double>(totals.tokens);
  // What the tasks generate: new tokens per task and how much of each output repeats itself.
  std::vector<double> lengths, repeats;
  for (const auto& output : totals.outputs) {
    lengths.push_back(static_cast<double>(output.size()));
    repeats.push_back(repeated_4grams(output));
  }
  state.counters["task_tokens_min"] = *std::min_element(lengths.begin(), lengths.end());
  state.counters["task_tokens_max"] = *std::max_element(lengths.begin(), lengths.end());
  state.counters["task_tokens_mean"] = std::accumulate(lengths.begin(), lengths.end(), 0.0) / lengths.size();
  state.counters["repeated_4grams_mean"] = std::accumulate(repeats.begin(), repeats.end(), 0.0) / repeats.size();
  state.counters["repeated_4grams_max"] = *std::max_element(repeats.begin(), repeats.end());
  // The context the decoding forwards actually saw, averaged over the new tokens (a task of prompt P and L new
  // tokens contributes P + i for i = 0..L-1), beside the cost context (mean prompt + half the token limit) at
  // which BM_Cost and the cost samples time the forwards: attention's share of a forward grows with it.
  double token_contexts = 0.0, new_tokens = 0.0;
  std::size_t output_index = 0;
  for (const auto& task : bench.tasks) {
    if (task.kind != kind || output_index >= totals.outputs.size()) continue;
    const auto length = static_cast<double>(totals.outputs[output_index++].size());
    token_contexts += length * static_cast<double>(task.prompt.size()) + length * (length - 1.0) / 2.0;
    new_tokens += length;
  }
  state.counters["mean_decoding_context"] = new_tokens > 0 ? token_contexts / new_tokens : 0.0;
  state.counters["cost_context"] = static_cast<double>(bench.cost_context.at(kind));
  state.SetItemsProcessed(static_cast<std::int64_t>(totals.tokens));
}

/// t_v(w) from a width -> seconds table (linear interpolation at a fractional width).
double verify_seconds(const std::map<std::size_t, double>& t, double width) {
  const auto lo = static_cast<std::size_t>(std::clamp(std::floor(width), 1.0, static_cast<double>(t.rbegin()->first)));
  const std::size_t hi = std::min(lo + 1, t.rbegin()->first);
  const double f = std::clamp(width - static_cast<double>(lo), 0.0, 1.0);
  return t.at(lo) + f * (t.at(hi) - t.at(lo));
}

/// Cost samples taken around the tasks of one configuration: the cost model's inputs measured in the same
/// minutes as the decoding they predict (the machine's speed drifts by 10-20% within minutes). One sample before
/// the first task and one after each task (each the median of a few calls, which keeps out a call that the OS
/// interrupted), so that every task sits between two samples. A task's costs are the mean of the two around it,
/// and the configuration's costs their mean over the tasks weighted by each task's new tokens, as the measured
/// speedup weighs them (total tokens over the tasks' total time; a task that ends early at its end-of-turn token
/// counts for less): when the machine changes phase during a configuration, a median would take one phase's
/// cost where the runs average both.
struct CostSamples {
  std::map<std::size_t, std::vector<double>> verify;  // width -> seconds, in the order taken
  std::vector<double> draft;                          // seconds per draft step, in the order taken
  std::vector<double> catch_up;                       // seconds per catch-up call of one token, likewise
  std::vector<double> weights;                        // per task: its new tokens

  /// The weighted mean over the tasks of the mean of the samples on either side of each (a single sample is its
  /// own mean). requires: v.size() == weights.size() + 1, or fewer than 2 samples.
  double mean(const std::vector<double>& v) const {
    if (v.size() < 2) return v.empty() ? 0.0 : v.front();
    double sum = 0.0, total = 0.0;
    for (std::size_t i = 0; i + 1 < v.size(); ++i) {
      const double w = i < weights.size() ? std::max(weights[i], 1.0) : 1.0;
      sum += w * 0.5 * (v[i] + v[i + 1]);
      total += w;
    }
    return sum / total;
  }
  std::map<std::size_t, double> verify_table() const {
    std::map<std::size_t, double> t;
    for (const auto& [w, v] : verify) t[w] = mean(v);
    return t;
  }
};

void BM_Speculative(benchmark::State& state, const std::string& kind, const std::string& mode, const std::string& draft_name,
                    std::size_t k, bool adaptive) {
  Bench& bench = Bench::get();
  // The 'from table' prediction reads the cost table (a filter may have left it out).
  if (!bench.t_verify.count(kind) || !bench.t_draft.count(kind) || !bench.t_draft.at(kind).count(draft_name))
    detail::fail("BM_E2E needs BM_Cost/", kind, "/target and BM_Cost/", kind, "/draft/", draft_name, " to run first");
  Totals totals, plain;
  CostSamples costs;
  std::vector<std::size_t> widths(k + 1);
  std::iota(widths.begin(), widths.end(), std::size_t{1});
  const std::size_t cost_repeats = 3;  // per sample: 6 tasks give 7 samples of 3 calls each
  for (auto _ : state) {
    with_draft(draft_name, [&](auto& draft) {
      const auto sample_costs = [&](const Generation* task) {
        if (task) costs.weights.push_back(static_cast<double>(task->stats.generated_tokens));
        const auto verify = median_forward_seconds(bench.target, bench.cost_context.at(kind), widths, [] {}, cost_repeats);
        for (std::size_t i = 0; i < widths.size(); ++i) costs.verify[widths[i]].push_back(verify[i]);
        costs.draft.push_back(draft_step_seconds(draft, kind, cost_repeats));
        costs.catch_up.push_back(draft_step_seconds(draft, kind, cost_repeats, false));
      };
      const auto go = [&](auto acceptance, auto length_policy) {
        sample_costs(nullptr);  // before the first task: every task then sits between two samples
        SpeculativeDecoder decoder(draft, bench.target, acceptance, length_policy);
        return run_tasks(kind, mode, [&](std::span<const Token> prompt, GenerateOptions options) {
          options.draft_length = k;
          return decoder.generate(prompt, options);
        }, &plain, [&](const Generation& g) { sample_costs(&g); });
      };
      if (mode == "sampled")
        totals = adaptive ? go(RejectionSampling{sampled_params()}, AdaptiveDraftLength{}) : go(RejectionSampling{sampled_params()}, FixedDraftLength{});
      else
        totals = adaptive ? go(Greedy{}, AdaptiveDraftLength{}) : go(Greedy{}, FixedDraftLength{});
    });
    state.SetIterationTime(totals.seconds);
  }
  const double rounds = static_cast<double>(std::max<std::size_t>(totals.rounds, 1));
  const double tau = static_cast<double>(totals.tokens) / rounds;
  const double steps = static_cast<double>(totals.draft_steps) / rounds;
  const double catch_ups = static_cast<double>(totals.catch_ups) / rounds;
  const double width = 1.0 + static_cast<double>(totals.drafted) / rounds;
  // S = tau * t_AR / (d * t_d + u * t_u + mean t_v over the rounds as they were; t_v is not linear in w, so not
  // t_v of the mean width), u the draft's catch-up calls per round, once with the costs sampled between this
  // configuration's tasks (`predicted`) and once with the kind's cost table measured before all runs
  // (`predicted_table`). Until 2026-12-06 a catch-up counted as a draft step: for early-exit:6, whose catch-up
  // skips an output head bigger than its six layers, at about 2.3 times its cost.
  // The rounds' verify calls priced at t_v of their widths.
  const auto priced_verify = [&](const std::map<std::size_t, double>& t_v) {
    double verify = 0.0;
    for (std::size_t w : totals.verify_widths) verify += verify_seconds(t_v, static_cast<double>(w));
    return verify;
  };
  const auto predict = [&](const std::map<std::size_t, double>& t_v, double t_d, double t_u) {
    return tau * t_v.at(1) / (steps * t_d + catch_ups * t_u + priced_verify(t_v) / rounds);
  };
  const auto t_v = costs.verify_table();
  const double t_d = costs.mean(costs.draft), t_u = costs.mean(costs.catch_up);
  const double predicted = predict(t_v, t_d, t_u);
  // Each term of the cost model in the runs over its samples, to show which term a gap between the measured
  // speedup and `predicted` comes from (the rest is the time outside the model calls: see predicted_in_run).
  const double sampled_verify = priced_verify(t_v);
  const double sampled_draft = static_cast<double>(totals.draft_steps) * t_d + static_cast<double>(totals.catch_ups) * t_u;
  if (plain.rounds > 0 && t_v.at(1) > 0)
    state.counters["in_run_t_ar"] = plain.model_seconds / static_cast<double>(plain.rounds) / t_v.at(1);
  if (sampled_verify > 0) state.counters["in_run_verify"] = totals.verify_call_seconds / sampled_verify;
  if (sampled_draft > 0)
    state.counters["in_run_draft"] = (totals.model_seconds - totals.verify_call_seconds) / sampled_draft;
  state.counters["predicted_table"] =
      predict(bench.t_verify.at(kind), bench.t_draft.at(kind).at(draft_name), bench.t_catch_up.at(kind).at(draft_name));
  state.counters["t_ar"] = t_v.at(1);
  state.counters["t_d"] = t_d;
  state.counters["t_u"] = t_u;
  state.counters["catch_ups_per_round"] = catch_ups;
  state.counters["tokens_per_second"] = totals.rate();
  state.counters["alpha"] = totals.drafted ? static_cast<double>(totals.accepted) / static_cast<double>(totals.drafted) : 0.0;
  state.counters["tau"] = tau;
  state.counters["draft_steps_per_round"] = steps;
  state.counters["verify_width"] = width;
  state.counters["speedup"] = totals.rate() / plain.rate();
  state.counters["plain_tokens_per_second"] = plain.rate();
  state.counters["predicted"] = predicted;
  // The same formula with the runs' own model-call times: t_AR the plain runs' mean forward, and the speculative
  // rounds' mean time inside draft and verify calls. It leaves out only the time outside the model calls, so
  // its gap to the measured speedup is how much more of a speculative run than of a plain one that time takes;
  // its gap to `predicted` is how much slower or faster the model calls ran inside decoding than in the cost
  // samples.
  state.counters["predicted_in_run"] =
      plain.model_seconds > 0 && totals.model_seconds > 0
          ? tau * (plain.model_seconds / static_cast<double>(plain.rounds)) / (totals.model_seconds / rounds)
          : 0.0;
  state.counters["c"] = t_d / t_v.at(1);
  // Against the paired plain runs (the same tasks; BM_Plain may have been filtered out).
  state.counters["identical"] = mode == "sampled" ? -1.0 : (totals.outputs == plain.outputs ? 1.0 : 0.0);
  // Positions no round reached (0 of 0) get no counter: a 0 there would read as "always rejected".
  for (std::size_t i = 0; i < totals.drafted_at.size() && totals.drafted_at[i] > 0; ++i)
    state.counters["acc" + std::to_string(i + 1)] =
        static_cast<double>(totals.accepted_at[i]) / static_cast<double>(totals.drafted_at[i]);
  state.SetItemsProcessed(static_cast<std::int64_t>(totals.tokens));
}

/// The adaptive draft length against every fixed k of a draft and plain decoding, interleaved task by task: each
/// task is decoded adaptively, with each fixed k and plainly, in an order that rotates from task to task, so
/// that all of them see the machine in the same minutes. (Run one configuration after another, as
/// BM_Speculative does, a slow phase of the machine that falls on the adaptive run alone decides the
/// comparison; here it cannot.) Counters: speedup_adaptive,
/// speedup_k<k>, best_k, adaptive_over_best (adaptive / the best fixed k), identical (1 when every greedy run,
/// adaptive and fixed, gave plain decoding's tokens; -1 for sampling), seeds (per task: SPECDEC_BENCH_SEEDS when
/// sampled, else 1).
void BM_Interleaved(benchmark::State& state, const std::string& kind, const std::string& mode, const std::string& draft_name,
                    const std::vector<std::size_t>& ks) {
  Bench& bench = Bench::get();
  Totals adaptive, plain;
  std::map<std::size_t, Totals> fixed;
  bool identical = true;
  for (auto _ : state) {
    with_draft(draft_name, [&](auto& draft) {
      const auto go = [&](auto acceptance) {
        // One adaptive decoder for all tasks of the kind, as a long-lived one would be; its policy learns on.
        SpeculativeDecoder adaptive_decoder(draft, bench.target, acceptance, AdaptiveDraftLength{});
        // Every decode starts from empty models (the decoders here share them, and each tracks what it fed).
        const auto reset = [&] {
          draft.truncate(0);
          bench.target.truncate(0);
        };
        // Sampled, every configuration writes its own text (the random draws a round makes depend on k), and
        // how much of it a draft can guess varies from text to text far more than the configurations differ:
        // with one seed per task the same lucky texts favoured k = 1 in every run (grounded prompt lookup
        // texts whose acceptance ranged from 0.2 to 0.8 between k = 1 and the adaptive run). So each task is
        // decoded with several seeds, and the speedups compare means over texts.
        const std::size_t passes = mode == "sampled" ? sampled_seeds() : 1;
        const auto kind_tasks = static_cast<std::size_t>(
            std::count_if(bench.tasks.begin(), bench.tasks.end(), [&](const Task& t) { return t.kind == kind; }));
        const std::size_t decodes = passes * kind_tasks;  // of each configuration
        std::size_t task_index = 0;
        for (std::size_t pass = 0; pass < passes; ++pass) {
          std::uint64_t seed = 1000 * pass;
          for (const auto& task : bench.tasks) {
            if (task.kind != kind) continue;
            ++seed;
            GenerateOptions options{.max_new_tokens = bench.max_new_tokens, .draft_length = *std::max_element(ks.begin(), ks.end()),
                                    .stop_tokens = bench.tokenizer.stop_tokens(),
                                    .seed = mode == "sampled" ? seed : 0};
            // The runs of a task in a rotating order (adaptive, each fixed k, plain), so that no configuration
            // always runs first or last. The rotation steps by runs / decodes a task, so that over the decodes
            // each configuration takes every place in the order about equally often (stepping by one, with 6
            // tasks and 10 configurations, plain decoding never ran first or second).
            const std::size_t runs = ks.size() + 2;
            const std::size_t offset = task_index * runs / decodes;
            std::vector<Generation> results(runs);
            for (std::size_t i = 0; i < runs; ++i) {
              const std::size_t run = (i + offset) % runs;
              reset();
              if (run == 0) {
                results[run] = adaptive_decoder.generate(task.prompt, options);
              } else if (run <= ks.size()) {
                GenerateOptions fixed_options = options;
                fixed_options.draft_length = ks[run - 1];
                results[run] = SpeculativeDecoder(draft, bench.target, acceptance).generate(task.prompt, fixed_options);
              } else {
                results[run] = generate_plain(mode, task.prompt, options);
              }
            }
            ++task_index;
            adaptive.add(results[0]);
            for (std::size_t i = 0; i < ks.size(); ++i) {
              fixed[ks[i]].add(results[i + 1]);
              identical = identical && results[i + 1].tokens == results[runs - 1].tokens;
            }
            identical = identical && results[0].tokens == results[runs - 1].tokens;
            plain.add(results[runs - 1]);
          }
        }
      };
      if (mode == "sampled")
        go(RejectionSampling{sampled_params()});
      else
        go(Greedy{});
    });
    state.SetIterationTime(adaptive.seconds);
  }
  double best = 0.0;
  std::size_t best_k = 0;
  for (const auto& [k, totals] : fixed) {
    const double speedup = totals.rate() / plain.rate();
    state.counters["speedup_k" + std::to_string(k)] = speedup;
    if (speedup > best) best = speedup, best_k = k;
  }
  const double speedup = adaptive.rate() / plain.rate();
  state.counters["speedup_adaptive"] = speedup;
  state.counters["best_k"] = static_cast<double>(best_k);
  state.counters["adaptive_over_best"] = best > 0 ? speedup / best : 0.0;
  state.counters["identical"] = mode == "sampled" ? -1.0 : identical ? 1.0 : 0.0;
  state.counters["seeds"] = static_cast<double>(mode == "sampled" ? sampled_seeds() : 1);
}

/// A target that replays recorded greedy outputs: the row after each position is one-hot on the token plain
/// greedy decoding produced there. With it, the real decoder, draft and draft-length policy run on the exact
/// acceptance pattern of the real model, and time is virtual (see VirtualTime), so policies can be compared
/// free of the machine's drift.
class ReplayTarget {
 public:
  explicit ReplayTarget(std::size_t vocab) : vocab_(vocab) {}
  void load(std::vector<Token> text) { text_ = std::move(text), held_ = 0; }
  std::size_t vocab_size() const { return vocab_; }
  std::size_t context_size() const { return held_; }
  const Logits& forward(std::span<const Token> tokens) {
    logits_.setConstant(static_cast<Eigen::Index>(tokens.size()), static_cast<Eigen::Index>(vocab_), -1e30f);
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      const std::size_t next = held_ + j + 1;
      logits_(static_cast<Eigen::Index>(j), next < text_.size() ? text_[next] : 0) = 0.0f;
    }
    held_ += tokens.size();
    return logits_;
  }
  void truncate(std::size_t n) { held_ = std::min(held_, n); }

 private:
  std::size_t vocab_;
  std::vector<Token> text_;  // prompt + recorded output
  std::size_t held_ = 0;
  Logits logits_;
};

/// A draft-length policy wrapper that replaces the decoder's measured times with a cost table's (t_v(w) for a
/// verify pass of w positions, t_d per draft step, nothing outside the model calls) and adds them up.
template <class Policy>
struct VirtualTime {
  Policy policy;
  const std::map<std::size_t, double>* t_v = nullptr;
  double t_d = 0.0;
  double* clock = nullptr;

  std::size_t next(const GenerateOptions& options) { return policy.next(options); }
  void begin_generation() {
    if constexpr (requires { policy.begin_generation(); }) policy.begin_generation();
  }
  void observe(RoundReport r) {
    r.draft_seconds = static_cast<double>(r.draft_steps) * t_d;
    r.catch_up_seconds = 0.0;
    r.verify_seconds = verify_seconds(*t_v, static_cast<double>(r.verify_width));
    r.round_seconds = r.draft_seconds + r.verify_seconds;
    *clock += r.round_seconds;
    policy.observe(r);
  }
};

/// Greedy prompt lookup replayed on the recorded plain greedy outputs of a task kind, in virtual time from the
/// cost table (BM_Cost): speedup of each fixed k and of the adaptive draft length over plain decoding (one
/// t_v(1) per token). Deterministic: the same tasks and costs give the same numbers, whatever the machine is
/// doing. Counters: replay_k<k>, replay_adaptive, replay_adaptive_over_best; for prompt lookup ("ngram") also the
/// best fixed k without a round budget and with the earlier one, budget_{none,earlier}_best{,_k}. Draft steps cost t_d; catching up
/// and the time outside the model calls are left out (both under 1% of a round for prompt lookup here).
void BM_Replay(benchmark::State& state, const std::string& kind, const std::string& draft_name,
               const std::vector<std::size_t>& ks) {
  Bench& bench = Bench::get();
  const std::string key = kind + "/greedy";
  if (!bench.plain_tokens.count(key)) detail::fail("BM_Replay needs BM_E2E/", key, "/plain to run first");
  if (!bench.t_verify.count(kind) || !bench.t_draft.count(kind) || !bench.t_draft.at(kind).count(draft_name))
    detail::fail("BM_Replay needs BM_Cost/", kind, "/target and BM_Cost/", kind, "/draft/", draft_name, " to run first");
  const auto& outputs = bench.plain_tokens.at(key);
  const auto& t_v = bench.t_verify.at(kind);
  const double t_d = bench.t_draft.at(kind).at(draft_name);
  std::map<std::size_t, double> speedup;  // k -> speedup of the fixed draft length
  double adaptive = 0.0;
  // Prompt lookup's round budget (draft_budget()) against none and against the one used until 2026-12-01 (2 and 4
  // tokens after 1- and 2-token matches, matches of up to 5 tokens): label -> (longest match, budget).
  const std::map<std::string, std::pair<std::size_t, std::vector<std::size_t>>> budget_variants = {
      {"budget_none", {PromptLookupDraft::kDefaultMaxNgram, {}}}, {"budget_earlier", {5, {2, 4}}}};
  std::map<std::string, std::pair<std::size_t, double>> variant_best;  // label -> (best fixed k, its speedup)
  for (auto _ : state) {
    const auto replay_with = [&](auto& draft, auto policy, std::size_t k) {
      ReplayTarget target(bench.target.vocab_size());
      double clock = 0.0;
      std::size_t tokens = 0, task_index = 0;
      SpeculativeDecoder decoder(draft, target, Greedy{}, VirtualTime<decltype(policy)>{policy, &t_v, t_d, &clock});
      for (const auto& task : bench.tasks) {
        if (task.kind != kind) continue;
        const auto& output = outputs.at(task_index++);
        std::vector<Token> text = task.prompt;
        text.insert(text.end(), output.begin(), output.end());
        target.load(text);
        draft.truncate(0);
        const auto g = decoder.generate(task.prompt, {.max_new_tokens = output.size(), .draft_length = k});
        if (g.tokens != output) detail::fail("replay of ", task.name, " did not reproduce its greedy output");
        tokens += g.tokens.size();
      }
      return clock > 0.0 ? static_cast<double>(tokens) * t_v.at(1) / clock : 0.0;
    };
    const auto replay = [&](auto policy, std::size_t k) {
      double result = 0.0;
      with_draft(draft_name, [&](auto& draft) { result = replay_with(draft, policy, k); });
      return result;
    };
    for (std::size_t k : ks) speedup[k] = replay(FixedDraftLength{}, k);
    adaptive = replay(AdaptiveDraftLength{}, *std::max_element(ks.begin(), ks.end()));
    if (draft_name == "ngram")
      for (const auto& [label, variant] : budget_variants)
        for (std::size_t k : ks) {
          PromptLookupDraft draft(bench.target.vocab_size(), variant.first, 1, variant.second);
          const double s = replay_with(draft, FixedDraftLength{}, k);
          if (s > variant_best[label].second) variant_best[label] = {k, s};
        }
    state.SetIterationTime(1e-3);
  }
  double best = 0.0;
  for (const auto& [k, s] : speedup) state.counters["replay_k" + std::to_string(k)] = s, best = std::max(best, s);
  state.counters["replay_adaptive"] = adaptive;
  state.counters["replay_adaptive_over_best"] = best > 0.0 ? adaptive / best : 0.0;
  for (const auto& [label, kb] : variant_best) {
    state.counters[label + "_best_k"] = static_cast<double>(kb.first);
    state.counters[label + "_best"] = kb.second;
  }
}

/// A draft length from a setting; `setting` names it in the error.
std::size_t parse_k(const std::string& text, const std::string& setting) {
  return bench::parse_count(text, setting + ": draft length", 1, 64);
}

/// Throws unless every item of a setting is one of `known`.
void check_known(const std::vector<std::string>& items, const std::vector<std::string>& known, const std::string& setting,
                 const std::string& what, const std::string& plural) {
  for (const auto& item : items)
    if (std::find(known.begin(), known.end(), item) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw std::runtime_error(setting + ": unknown " + what + " '" + item + "' (the " + plural + ": " + list + ")");
    }
}

/// The first CPU's "model name", "cpu family" and "model" from /proc/cpuinfo, as cpu_model, cpu_family and
/// cpu_model_number; those it cannot read are left out (other systems have no /proc/cpuinfo).
std::vector<std::pair<std::string, std::string>> cpu_identity() {
  const std::pair<std::string, std::string> fields[] = {
      {"model name", "cpu_model"}, {"cpu family", "cpu_family"}, {"model", "cpu_model_number"}};
  std::vector<std::pair<std::string, std::string>> found;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line) && found.size() < std::size(fields);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    for (const auto& [name, label] : fields)
      if (key == name && std::none_of(found.begin(), found.end(), [&](const auto& f) { return f.first == label; }))
        found.emplace_back(label, value);
  }
  return found;
}

/// Registers everything in the order it must run: costs, then per kind and mode the plain baseline first.
int register_benchmarks() {
  (void)sampled_seeds(), (void)default_repeats();  // a bad count ends the run now, not after the baselines
  const auto drafts_env = split(env("SPECDEC_BENCH_DRAFTS", "ngram,early-exit:4,early-exit:10"));
  std::vector<std::string> drafts = drafts_env;
  if (!env("SPECDEC_BENCH_DRAFT_MODEL", "").empty()) drafts.push_back("model");
  std::vector<std::size_t> ks;
  for (const auto& k : split(env("SPECDEC_BENCH_KS", "1,2,3,4,5,6,7,8"))) ks.push_back(parse_k(k, "SPECDEC_BENCH_KS"));
  if (ks.empty()) throw std::runtime_error("SPECDEC_BENCH_KS names no k");

  benchmark::RegisterBenchmark("BM_Cost/bandwidth", BM_CostBandwidth)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_Cost/clock/start", BM_CostClock)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  // A draft may name its own k list after '@', with '+' between values: "early-exit:6@1+2+4".
  const auto ks_of = [&](std::string& draft) {
    const auto at = draft.find('@');
    if (at == std::string::npos) return ks;
    std::vector<std::size_t> own;
    std::stringstream in(draft.substr(at + 1));
    for (std::string k; std::getline(in, k, '+');) own.push_back(parse_k(k, "draft " + draft));
    if (own.empty()) throw std::runtime_error("draft " + draft + " names no k after '@'");
    draft.resize(at);
    return own;
  };
  std::vector<std::pair<std::string, std::vector<std::size_t>>> plan;
  std::optional<std::uint64_t> layers;  // the model's, read at the first early-exit draft (before Bench loads it)
  for (auto d : drafts) {
    auto own = ks_of(d);
    // A bad name, or more layers than the model has, ends the run now, not after the baselines.
    if (const DraftName parsed(d); parsed.kind == DraftName::Kind::early_exit) {
      if (!layers) layers = gguf::File::open(Bench::model_path()).find_uint("llama.block_count").value_or(0);
      if (parsed.size > *layers)
        detail::fail("draft '", d, "': the model (", Bench::model_path(), ") has ", *layers, " layers");
    }
    plan.emplace_back(d, own);
  }
  // The cost table covers every k that any draft runs.
  std::size_t max_k = *std::max_element(ks.begin(), ks.end());
  for (const auto& [d, draft_ks] : plan) max_k = std::max(max_k, *std::max_element(draft_ks.begin(), draft_ks.end()));
  const auto kinds = split(env("SPECDEC_BENCH_KINDS", "grounded,chat,code"));
  const auto modes = split(env("SPECDEC_BENCH_MODES", "greedy,sampled"));
  check_known(kinds, {kTaskKinds.begin(), kTaskKinds.end()}, "SPECDEC_BENCH_KINDS", "task kind", "kinds");
  check_known(modes, {"greedy", "sampled"}, "SPECDEC_BENCH_MODES", "mode", "modes");
  for (const auto& kind : kinds) {
    for (std::size_t w = 1; w <= max_k + 1; ++w)
      benchmark::RegisterBenchmark(("BM_Cost/" + kind + "/target/w" + std::to_string(w)).c_str(), BM_CostTarget, kind, w,
                                   max_k + 1)
          ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    for (const auto& [d, draft_ks] : plan)
      benchmark::RegisterBenchmark(("BM_Cost/" + kind + "/draft/" + d).c_str(), BM_CostDraft, kind, d)
          ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Stages/" + kind).c_str(), BM_Stages, kind, max_k + 1)
        ->Iterations(1)->Unit(benchmark::kMillisecond);
  }
  for (const auto& kind : kinds)
    for (const auto& mode : modes) {
      const std::string prefix = "BM_E2E/" + kind + "/" + mode + "/";
      benchmark::RegisterBenchmark((prefix + "plain").c_str(), BM_Plain, kind, mode)
          ->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
      for (const auto& [d, draft_ks] : plan) {
        for (std::size_t k : draft_ks)
          benchmark::RegisterBenchmark((prefix + d + "/k" + std::to_string(k)).c_str(), BM_Speculative, kind, mode, d, k, false)
              ->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
        // Adaptive chooses up to the draft's largest k, as in BM_Interleaved.
        const std::size_t draft_max_k = *std::max_element(draft_ks.begin(), draft_ks.end());
        benchmark::RegisterBenchmark((prefix + d + "/adaptive").c_str(), BM_Speculative, kind, mode, d, draft_max_k, true)
            ->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
      }
    }
  const bool greedy = std::find(modes.begin(), modes.end(), "greedy") != modes.end();
  for (const auto& kind : kinds)
    for (const auto& [d, draft_ks] : plan)
      if (greedy && d.starts_with("ngram"))
        benchmark::RegisterBenchmark(("BM_Replay/" + kind + "/greedy/" + d).c_str(), BM_Replay, kind, d, draft_ks)
            ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  for (const auto& kind : kinds)
    for (const auto& mode : modes)
      for (const auto& [d, draft_ks] : plan)
        benchmark::RegisterBenchmark(("BM_Interleaved/" + kind + "/" + mode + "/" + d).c_str(), BM_Interleaved, kind, mode, d,
                                     draft_ks)
            ->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_Cost/clock/end", BM_CostClock)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
  return 0;
}
/// Registration runs before main(): a bad setting ends the program with its message here, not in std::terminate.
int register_all() {
  try {
    return register_benchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_e2e: %s\n", e.what());
    std::exit(2);
  }
}
const int registered = register_all();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    // The settings the report states, as the loaded target has them, recorded with the results.
    const llama::LlamaModel& target = Bench::get().target;
    benchmark::AddCustomContext("specdec_threads", std::to_string(target.pool()->threads()));
    benchmark::AddCustomContext("specdec_format", std::string(llama::to_string(target.format())));
    benchmark::AddCustomContext("specdec_kv_format", llama::to_string(target.kv_format()));
    // The CPU that ran the benchmark, for the report (scripts/make-report may run elsewhere, later): "AMD EPYC"
    // alone does not tell a Zen 4 (family 25) from a Zen 5 (family 26).
    for (const auto& [key, value] : cpu_identity()) benchmark::AddCustomContext(key, value);
    if (benchmark::RunSpecifiedBenchmarks() == 0) {
      std::fprintf(stderr, "bench_e2e: no benchmark matches the filter\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_e2e: %s\n", e.what());
    return 2;
  }
  benchmark::Shutdown();
  return 0;
}

// torch.save-format state dicts, the pickler under them, safetensors, and
// module and optimizer state dicts, in one process: round trips bit for
// bit, and every bad input refused with a message naming the file and the
// key (src/checkpoint/). Files of PyTorch itself are checked by the shell
// tests (interop_cases.sh).

#include <gtest/gtest.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <random>

#include <ddp/checkpoint/safetensors.h>
#include <ddp/checkpoint/state_dict.h>
#include <ddp/checkpoint/torch_format.h>
#include <ddp/nn/fully_sharded_data_parallel.h>

#include "checkpoint/checkpoint_testing.h"
#include "checkpoint/interop_model.h"
#include "checkpoint/pickle.h"
#include "checkpoint/torch_save.h"

namespace {

namespace pk = ddp::checkpoint::pickle;

using ddp_test::checkpoint::error_of;
using ddp_test::checkpoint::read_all;
using ddp_test::checkpoint::TempDir;
using ddp_test::checkpoint::write_all;

ddp::StateDict sample_state() {
  ddp::StateDict s;
  s.insert("a.weight", torch::randn({3, 5}));
  s.insert("a.bias", torch::randn({5}, torch::kFloat64));
  s.insert("half", torch::randn({4}).to(torch::kBFloat16));
  s.insert("steps", torch::tensor(int64_t{7}));
  s.insert("flags", torch::tensor({true, false, true}));
  s.insert("empty", torch::empty({0, 3}));
  s.insert("strided", torch::arange(12, torch::kFloat).view({3, 4}).t()); // not contiguous
  return s;
}

void expect_same(const ddp::StateDict& a, const ddp::StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& item : a) {
    const auto& other = b[item.key()];
    EXPECT_EQ(item.value().scalar_type(), other.scalar_type()) << item.key();
    EXPECT_EQ(item.value().sizes(), other.sizes()) << item.key();
    EXPECT_TRUE(at::equal(item.value(), other)) << item.key();
  }
}

// ---- pickle -------------------------------------------------------------------

TEST(Pickle, RoundTripOfEveryKind) {
  auto value = pk::dict(
      {{pk::string("none"), pk::none()},
       {pk::string("flags"), pk::tuple({pk::boolean(true), pk::boolean(false)})},
       {pk::string("ints"), pk::list({pk::integer(0), pk::integer(255), pk::integer(256), pk::integer(65536),
                                      pk::integer(-1), pk::integer(int64_t{1} << 40), pk::integer(INT64_MIN)})},
       {pk::string("float"), pk::number(0.1)},
       {pk::integer(3), pk::string("int key, \xc3\xa9 text")},
       {pk::string("ordered"), pk::dict({{pk::string("x"), pk::number(-2.5)}}, true)}});
  const std::string bytes = pk::Writer().write(*value);
  auto back = pk::Reader(bytes.data(), bytes.size(), "test", {}).read();
  ASSERT_TRUE(back->is(pk::Value::Kind::kDict));
  EXPECT_EQ(back->entries.size(), 6u);
  EXPECT_TRUE(back->get("none")->is(pk::Value::Kind::kNone));
  EXPECT_TRUE(back->get("flags")->items[0]->boolean);
  const auto& ints = back->get("ints")->items;
  ASSERT_EQ(ints.size(), 7u);
  EXPECT_EQ(ints[2]->integer, 256);
  EXPECT_EQ(ints[4]->integer, -1);
  EXPECT_EQ(ints[5]->integer, int64_t{1} << 40);
  EXPECT_EQ(ints[6]->integer, INT64_MIN);
  EXPECT_EQ(back->get("float")->number, 0.1);
  EXPECT_EQ(back->entries[4].first->integer, 3);
  EXPECT_EQ(back->entries[4].second->text, "int key, \xc3\xa9 text");
  EXPECT_TRUE(back->get("ordered")->ordered);
}

TEST(Pickle, DamagedInputIsAnErrorNeverACrash) {
  auto value = pk::dict({{pk::string("k"), pk::list({pk::integer(1), pk::number(2), pk::string("three")})},
                         {pk::string("o"), pk::object(pk::global("m", "C"), pk::dict({}))}});
  const std::string good = pk::Writer().write(*value);
  for (size_t n = 0; n < good.size(); ++n) { // every truncation
    const std::string cut = good.substr(0, n);
    EXPECT_THROW(pk::Reader(cut.data(), cut.size(), "cut", {}).read(), std::runtime_error) << n;
  }
  std::mt19937 random(7);
  for (int trial = 0; trial < 2000; ++trial) { // random damage: parsed or refused, never a crash
    std::string bad = good;
    bad[random() % bad.size()] = static_cast<char>(random());
    try {
      pk::Reader(bad.data(), bad.size(), "damaged", {}).read();
    } catch (const std::runtime_error&) {
    }
  }
  const std::string unknown = "\x80\x02\xff.";
  EXPECT_THROW(pk::Reader(unknown.data(), unknown.size(), "x", {}).read(), std::runtime_error);
  const std::string memo = "\x80\x02h\x05.";
  try {
    pk::Reader(memo.data(), memo.size(), "'f' data.pkl", {}).read();
    ADD_FAILURE() << "an unset memo index was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'f' data.pkl: not a pickle ddp can read: memo index 5"), std::string::npos)
        << e.what();
  }
}

// ---- torch.save format -------------------------------------------------------------

TEST(TorchFormat, StateDictRoundTripBitForBit) {
  TempDir dir;
  const auto state = sample_state();
  ddp::save_torch_state_dict(state, dir.file("m.pt"));
  expect_same(state, ddp::load_torch_state_dict(dir.file("m.pt")));
  // A dict under a key, as torch.save({"model": ...}) writes it.
  auto nested = pk::dict({{pk::string("epoch"), pk::integer(3)},
                          {pk::string("model"), pk::dict({{pk::string("w"), pk::tensor(torch::ones({2}))}}, true)}});
  ddp::checkpoint::save_torch_file(*nested, dir.file("n.pt"));
  EXPECT_TRUE(at::equal(ddp::load_torch_state_dict(dir.file("n.pt"), "model")["w"], torch::ones({2})));
  EXPECT_ERROR(ddp::load_torch_state_dict(dir.file("n.pt")), "'epoch' is int 3, expected a tensor");
  EXPECT_ERROR(ddp::load_torch_state_dict(dir.file("n.pt"), "optimizer"), "has no key 'optimizer' (its keys: 'epoch', 'model')");
}

TEST(TorchFormat, BadFilesAreRefusedNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("m.pt");
  ddp::save_torch_state_dict(sample_state(), path);
  const std::string good = read_all(path);
  EXPECT_ERROR(ddp::load_torch_state_dict(dir.file("absent.pt")), "cannot open '" + dir.file("absent.pt") + "'");
  write_all(path, "");
  EXPECT_ERROR(ddp::load_torch_state_dict(path), "'" + path + "' is not a torch.save file");
  for (size_t cut : {good.size() / 3, good.size() / 2, good.size() - 30}) {
    write_all(path, good.substr(0, cut));
    EXPECT_ERROR(ddp::load_torch_state_dict(path), "'" + path + "'");
  }
  // LibTorch's own torch::save archive (TorchScript) is not a state dict.
  torch::nn::Linear linear(2, 2);
  torch::save(linear, path);
  EXPECT_ERROR(ddp::load_torch_state_dict(path), "a TorchScript archive");
  // A damaged data.pkl: refused, never a crash.
  std::string damaged = good;
  const size_t at = damaged.find("_rebuild_tensor_v2");
  ASSERT_NE(at, std::string::npos);
  damaged.replace(at, 4, "XXXX");
  write_all(path, damaged);
  EXPECT_ERROR(ddp::load_torch_state_dict(path), "'" + path + "'");
}

TEST(TorchFormat, WritesWhatTorchSaveWrites) {
  TempDir dir;
  ddp::StateDict s;
  s.insert("w", torch::ones({2, 3}));
  ddp::save_torch_state_dict(s, dir.file("m.pt"));
  caffe2::serialize::PyTorchStreamReader zip(std::make_shared<ddp::checkpoint::FileRange>(dir.file("m.pt")));
  EXPECT_TRUE(zip.hasRecord("data.pkl"));
  EXPECT_TRUE(zip.hasRecord("byteorder"));
  EXPECT_TRUE(zip.hasRecord("data/0"));
  auto [pkl, n] = zip.getRecord("data.pkl");
  const std::string text(static_cast<const char*>(pkl.get()), n);
  // collections.OrderedDict of _rebuild_tensor_v2 over a FloatStorage on the CPU.
  EXPECT_NE(text.find("ccollections\nOrderedDict\n"), std::string::npos);
  EXPECT_NE(text.find("ctorch._utils\n_rebuild_tensor_v2\n"), std::string::npos);
  EXPECT_NE(text.find("ctorch\nFloatStorage\n"), std::string::npos);
  EXPECT_NE(text.find("cpu"), std::string::npos);
}

// ---- module state dicts ---------------------------------------------------------------

TEST(ModuleStateDict, NamesAndOrderArePyTorchs) {
  auto net = ddp_test::interop::make_model();
  const auto state = ddp::module_state_dict(*net);
  // Python: list(nn.Sequential(Linear, BatchNorm1d, ReLU, Linear).state_dict())
  const std::vector<std::string> expected = {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                             "1.running_var", "1.num_batches_tracked", "3.weight", "3.bias"};
  EXPECT_EQ(state.keys(), expected);
}

struct WithUnits : torch::nn::Module {
  WithUnits() {
    scale = register_parameter("scale", torch::ones({2}));
    block = register_module("block", ddp::FsdpUnit(torch::nn::Linear(2, 2)));
  }
  at::Tensor scale;
  ddp::FsdpUnit block{nullptr};
};

TEST(ModuleStateDict, FsdpUnitsAddNoLevel) {
  auto net = std::make_shared<WithUnits>();
  const auto state = ddp::module_state_dict(*net);
  EXPECT_EQ(state.keys(), (std::vector<std::string>{"scale", "block.weight", "block.bias"}));
  // The names of earlier ddp versions still load.
  ddp::StateDict old;
  old.insert("scale", torch::full({2}, 3.0));
  old.insert("block.module.weight", torch::full({2, 2}, 4.0));
  old.insert("block.module.bias", torch::full({2}, 5.0));
  ddp::load_module_state_dict(*net, old);
  EXPECT_TRUE(at::equal(net->block->module()->named_parameters()["weight"], torch::full({2, 2}, 4.0)));
}

TEST(ModuleStateDict, LoadChecksEverythingFirst) {
  auto net = ddp_test::interop::make_model();
  auto state = ddp::module_state_dict(*net);
  ddp::StateDict changed;
  for (const auto& item : state) {
    changed.insert(item.key(), item.value().clone().add_(1));
  }
  changed.erase("3.bias");
  changed.insert("4.weight", torch::ones({1}));
  const auto before = ddp::module_state_dict(*net)["0.weight"].clone();
  EXPECT_ERROR(ddp::load_module_state_dict(*net, changed),
               "missing keys: 3.bias; unexpected keys: 4.weight");
  EXPECT_TRUE(at::equal(net->named_parameters()["0.weight"], before)) << "changed before the error";
  const auto result = ddp::load_module_state_dict(*net, changed, ddp::LoadStateDictOptions().strict(false));
  EXPECT_EQ(result.missing_keys, std::vector<std::string>{"3.bias"});
  EXPECT_EQ(result.unexpected_keys, std::vector<std::string>{"4.weight"});
  EXPECT_TRUE(at::equal(net->named_parameters()["0.weight"], before + 1));
  changed.insert("3.bias", torch::ones({5}));
  EXPECT_ERROR(ddp::load_module_state_dict(*net, changed, ddp::LoadStateDictOptions().strict(false)),
               "size mismatch for 3.bias: the state's tensor has shape [5], the module's [4]");
}

// ---- optimizer state dicts -------------------------------------------------------------

class OptimizerStateDict : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerStateDict, RoundTripThenTheSameStep) {
  TempDir dir;
  using ddp_test::interop::batch;
  auto train = [](torch::nn::Sequential& net, torch::optim::Optimizer& opt, int from, int n) {
    for (int s = from; s < from + n; ++s) {
      auto [x, y] = batch(s, 0, 1);
      opt.zero_grad();
      torch::mse_loss(net->forward(x), y).backward();
      opt.step();
    }
  };
  auto net = ddp_test::interop::make_model();
  auto opt = ddp_test::interop::make_optimizer(GetParam(), net->parameters());
  train(net, *opt, 0, 3);
  ddp::save_torch_state_dict(ddp::module_state_dict(*net), dir.file("m.pt"));
  ddp::save_torch_optimizer_state_dict(ddp::optimizer_state_dict(*opt), dir.file("o.pt"));

  auto net2 = ddp_test::interop::make_model();
  auto opt2 = ddp_test::interop::make_optimizer(GetParam(), net2->parameters());
  ddp::load_module_state_dict(*net2, ddp::load_torch_state_dict(dir.file("m.pt")));
  const auto loaded = ddp::load_torch_optimizer_state_dict(dir.file("o.pt"));
  ddp::load_optimizer_state_dict(*opt2, loaded);
  EXPECT_EQ(loaded.param_groups.at(0).params.size(), 6u);
  train(net, *opt, 3, 2);
  train(net2, *opt2, 3, 2);
  expect_same(ddp::module_state_dict(*net), ddp::module_state_dict(*net2));
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, OptimizerStateDict,
                         ::testing::Values("adam", "adamw", "sgd", "rmsprop", "adagrad"));

TEST(OptimizerStateDictErrors, RefusedNamingTheProblem) {
  auto net = ddp_test::interop::make_model();
  auto adam = ddp_test::interop::make_optimizer("adam", net->parameters());
  auto [x, y] = ddp_test::interop::batch(0, 0, 1);
  torch::mse_loss(net->forward(x), y).backward();
  adam->step();
  const auto good = ddp::optimizer_state_dict(*adam);
  EXPECT_EQ(good.state.at(0).keys(), (std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(good.state.at(0)["step"].item<float>(), 1.0f);

  auto fresh = ddp_test::interop::make_optimizer("adam", net->parameters());
  auto bad = good;
  bad.param_groups.push_back(bad.param_groups[0]);
  EXPECT_ERROR(ddp::load_optimizer_state_dict(*fresh, bad), "the state has 2 parameter groups, this Adam has 1");
  bad = good;
  bad.param_groups[0].params.pop_back();
  EXPECT_ERROR(ddp::load_optimizer_state_dict(*fresh, bad), "parameter group 0 of the state has 5 parameters");
  auto with_option = [&](const char* name, bool value) {
    auto out = good;
    for (auto& [k, v] : out.param_groups[0].options) {
      if (k == name) {
        v = value;
      }
    }
    return out;
  };
  bad = with_option("maximize", true);
  EXPECT_ERROR(ddp::load_optimizer_state_dict(*fresh, bad), "option 'maximize' is True");
  bad = with_option("decoupled_weight_decay", true);
  EXPECT_ERROR(ddp::load_optimizer_state_dict(*fresh, bad), "the state is of AdamW");
  bad = good;
  bad.state[2].erase("exp_avg");
  EXPECT_ERROR(ddp::load_optimizer_state_dict(*fresh, bad), "parameter 2 (group 0, index 2): the state has no 'exp_avg'");
  bad = good;
  bad.state[0]["exp_avg_sq"] = torch::zeros({3});
  EXPECT_ERROR(ddp::load_optimizer_state_dict(*fresh, bad), "'exp_avg_sq' has shape [3], the parameter's is [16, 8]");
  EXPECT_TRUE(fresh->state().empty()) << "a refused load changed the optimizer";
}

// ---- safetensors -----------------------------------------------------------------------

TEST(Safetensors, RoundTripAndHeader) {
  TempDir dir;
  auto state = sample_state();
  state.erase("strided");
  state.insert("strided", torch::arange(12, torch::kFloat).view({3, 4}).t());
  ddp::save_safetensors(state, dir.file("m.safetensors"), {{"framework", "ddp"}});
  expect_same(state, [&] {
    auto back = ddp::load_safetensors(dir.file("m.safetensors"));
    ddp::StateDict ordered;
    for (const auto& k : state.keys()) {
      ordered.insert(k, back[k]);
    }
    return ordered;
  }());
  EXPECT_EQ(ddp::safetensors_metadata(dir.file("m.safetensors")).at("framework"), "ddp");
  const std::string bytes = read_all(dir.file("m.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data must start 8-aligned";
  EXPECT_EQ(bytes[8], '{');
}

TEST(Safetensors, BadFilesAreRefusedNamingFileAndKey) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  ddp::StateDict state;
  state.insert("w", torch::ones({2, 3}));
  state.insert("b", torch::ones({3}));
  ddp::save_safetensors(state, path);
  const std::string good = read_all(path);
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  std::string header = good.substr(8, n);
  const std::string data = good.substr(8 + n);
  auto with_header = [&](std::string h) {
    h.append((8 - h.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const uint64_t len = h.size();
    std::memcpy(out.data(), &len, 8);
    return out + h + data;
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string h = header;
    const size_t at = h.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << h;
    return with_header(h.replace(at, from.size(), to));
  };
  write_all(path, good.substr(0, 5));
  EXPECT_ERROR(ddp::load_safetensors(path), "is not a safetensors file: it has fewer than 8 bytes");
  write_all(path, std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}");
  EXPECT_ERROR(ddp::load_safetensors(path), "its header length says 4294967295 bytes");
  write_all(path, with_header("{not json"));
  EXPECT_ERROR(ddp::load_safetensors(path), "its header is not JSON");
  write_all(path, replaced("\"F32\"", "\"F31\""));
  EXPECT_ERROR(ddp::load_safetensors(path), "tensor '");
  EXPECT_ERROR(ddp::load_safetensors(path), "dtype 'F31' is not one ddp reads");
  write_all(path, replaced("[2, 3]", "[2, 4]"));
  EXPECT_ERROR(ddp::load_safetensors(path), "tensor 'w': shape [2, 4] of F32 takes 32 bytes, its data_offsets give 24");
  write_all(path, good.substr(0, good.size() - 4));
  EXPECT_ERROR(ddp::load_safetensors(path), "lie beyond the file's");
  write_all(path, replaced("[24, 36]", "[20, 32]"));
  EXPECT_ERROR(ddp::load_safetensors(path), "tensor 'b': its bytes start at 20, expected 24 (tensors overlap or leave a gap)");
}

} // namespace

#include "data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <sys/stat.h>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

namespace mnist {

namespace {

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;
// MNIST's mean and standard deviation, as in PyTorch's MNIST example.
constexpr double kMean = 0.1307;
constexpr double kStd = 0.3081;

} // namespace

// ---- ImageDataset ------------------------------------------------------------

ImageDataset::ImageDataset(torch::Tensor images, torch::Tensor labels)
    : images_(std::move(images)), labels_(std::move(labels)) {
  TORCH_CHECK(images_.dim() == 3 && images_.size(1) == kSide && images_.size(2) == kSide &&
                  images_.scalar_type() == torch::kByte,
              "ImageDataset: images must be uint8 [N, 28, 28] (got ", images_.scalar_type(), " ",
              images_.sizes(), ")");
  TORCH_CHECK(labels_.dim() == 1 && labels_.size(0) == images_.size(0),
              "ImageDataset: ", images_.size(0), " images but labels of shape ", labels_.sizes());
}

torch::data::Example<> ImageDataset::get_batch(c10::ArrayRef<size_t> indices) {
  std::vector<int64_t> rows(indices.begin(), indices.end());
  auto index = torch::tensor(rows, torch::kLong);
  auto images = images_.index_select(0, index).unsqueeze(1).to(torch::kFloat).div_(255);
  return {images.sub_(kMean).div_(kStd), labels_.index_select(0, index)};
}

c10::optional<size_t> ImageDataset::size() const {
  return static_cast<size_t>(images_.size(0));
}

ImageDataset ImageDataset::head(int64_t count) const {
  const int64_t n = std::min(count, images_.size(0));
  return ImageDataset(images_.slice(0, 0, n), labels_.slice(0, 0, n));
}

// ---- IDX files -------------------------------------------------------------------

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

uint32_t read_big_endian_u32(std::istream& in, const std::string& path) {
  unsigned char bytes[4];
  if (!in.read(reinterpret_cast<char*>(bytes), 4)) {
    fail(path, "truncated header");
  }
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// Reads an IDX file of unsigned bytes with `dims` dimensions: a magic number
// 0x000008<dims>, the sizes as big-endian 32-bit integers, then the data.
torch::Tensor read_idx(const std::string& path, int dims) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    struct stat info {};
    if (::stat((path + ".gz").c_str(), &info) == 0) {
      fail(path, "not found, but " + path + ".gz is: decompress it first (gunzip -k " + path +
                     ".gz)");
    }
    fail(path, "cannot open (does --data name the directory holding MNIST's four IDX files?)");
  }
  const uint32_t magic = read_big_endian_u32(in, path);
  const uint32_t expected = 0x00000800u | static_cast<uint32_t>(dims);
  if (magic != expected) {
    char text[96];
    std::snprintf(text, sizeof text,
                  "not an IDX file of %d-dimensional unsigned bytes (magic 0x%08x, expected 0x%08x)",
                  dims, magic, expected);
    fail(path, text);
  }
  std::vector<int64_t> sizes;
  for (int d = 0; d < dims; ++d) {
    sizes.push_back(read_big_endian_u32(in, path));
  }
  auto tensor = torch::empty(sizes, torch::kByte);
  const auto bytes = static_cast<std::streamsize>(tensor.numel());
  in.read(reinterpret_cast<char*>(tensor.data_ptr<uint8_t>()), bytes);
  if (in.gcount() != bytes) {
    fail(path, "truncated: the header announces " + std::to_string(bytes) +
                   " bytes of data, the file holds " + std::to_string(in.gcount()));
  }
  return tensor;
}

ImageDataset read_pair(const std::string& dir, const std::string& prefix) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte";
  auto images = read_idx(images_path, 3);
  auto labels = read_idx(labels_path, 1);
  if (images.size(1) != kSide || images.size(2) != kSide) {
    fail(images_path, "images are " + std::to_string(images.size(1)) + "x" +
                          std::to_string(images.size(2)) + ", expected 28x28");
  }
  if (labels.size(0) != images.size(0)) {
    fail(labels_path, std::to_string(labels.size(0)) + " labels for " +
                          std::to_string(images.size(0)) + " images in " + images_path);
  }
  if (labels.numel() > 0 && labels.max().item<int64_t>() >= kClasses) {
    fail(labels_path, "label " + std::to_string(labels.max().item<int64_t>()) +
                          " is out of range (expected 0 to 9)");
  }
  return ImageDataset(images, labels.to(torch::kLong));
}

} // namespace

Split read_idx_dir(const std::string& dir) {
  return Split{read_pair(dir, "train"), read_pair(dir, "t10k")};
}

// ---- Synthetic data -----------------------------------------------------------

namespace {

// A uniform double in [lo, hi) from the generator's raw output: the
// std::uniform_real_distribution algorithm is left to each standard library,
// std::mt19937_64 is not, so these numbers are the same everywhere.
double uniform(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// One pattern per class: five Gaussian blobs at random places, scaled to a
// peak of 1. Float [kClasses, 28, 28].
torch::Tensor class_templates(std::mt19937_64& rng) {
  auto ys = torch::arange(kSide, torch::kFloat).view({kSide, 1});
  auto xs = torch::arange(kSide, torch::kFloat).view({1, kSide});
  std::vector<torch::Tensor> templates;
  for (int64_t c = 0; c < kClasses; ++c) {
    auto t = torch::zeros({kSide, kSide});
    for (int blob = 0; blob < 5; ++blob) {
      const double cy = uniform(rng, 6, 22);
      const double cx = uniform(rng, 6, 22);
      const double sigma = uniform(rng, 1.5, 3.5);
      t += torch::exp(-((ys - cy).pow(2) + (xs - cx).pow(2)) / (2 * sigma * sigma));
    }
    templates.push_back(t / t.max());
  }
  return torch::stack(templates);
}

ImageDataset sample(const torch::Tensor& templates, int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto noise_generator = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> images;
  std::vector<int64_t> labels;
  images.reserve(static_cast<size_t>(count));
  labels.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<int64_t>(rng() % kClasses);
    const auto dy = static_cast<int64_t>(rng() % 5) - 2;
    const auto dx = static_cast<int64_t>(rng() % 5) - 2;
    const double brightness = uniform(rng, 0.5, 1.0);
    images.push_back(torch::roll(templates[label], {dy, dx}, {0, 1}) * brightness);
    labels.push_back(label);
  }
  auto clean = count > 0 ? torch::stack(images) : torch::zeros({0, kSide, kSide});
  auto noisy = clean + 0.35 * torch::randn({count, kSide, kSide}, noise_generator);
  auto bytes = noisy.clamp(0, 1).mul(255).round().to(torch::kByte);
  return ImageDataset(bytes, torch::tensor(labels, torch::kLong));
}

} // namespace

Split make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed) {
  // Separate streams for the patterns and the two splits, so that the test
  // set does not change with --train-size.
  std::mt19937_64 rng(seed);
  const auto templates = class_templates(rng);
  return Split{sample(templates, train_size, seed + 1000003),
               sample(templates, test_size, seed + 2000003)};
}

} // namespace mnist

#pragma once

// The data of mnist_train: 28x28 grayscale images of 10 classes, read from
// MNIST's IDX files or generated.

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace mnist {

/// Images and labels held in memory; a batch is gathered with one
/// `index_select`, so the data loader needs no `Stack` transform.
///
/// Images are kept as bytes (a quarter of the memory of floats) and turned
/// into normalised floats batch by batch.
///
/// Thread-safety: `get_batch` only reads, so data loader workers may share
/// it.
class ImageDataset
    : public torch::data::datasets::BatchDataset<ImageDataset, torch::data::Example<>> {
 public:
  /// `images`: uint8 [N, 28, 28]; `labels`: int64 [N] in [0, 10).
  ImageDataset(torch::Tensor images, torch::Tensor labels);

  /// The examples at `indices`: data float [B, 1, 28, 28] normalised with
  /// MNIST's mean and standard deviation, target int64 [B].
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override;

  /// The number of examples.
  c10::optional<size_t> size() const override;

  /// The first `count` examples (all of them when `count` is larger).
  ImageDataset head(int64_t count) const;

 private:
  torch::Tensor images_; // uint8 [N, 28, 28]
  torch::Tensor labels_; // int64 [N]
};

/// A training set and a held-out test set.
struct Split {
  ImageDataset train;
  ImageDataset test;
};

/// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte,
/// t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (MNIST, or
/// Fashion-MNIST, which has the same format) from `dir`. Unlike
/// torch::data::datasets::MNIST it accepts any number of images, so a
/// subset written in the same format works too. Throws std::runtime_error
/// naming the file and what is wrong with it.
Split read_idx_dir(const std::string& dir);

/// Generates `train_size` + `test_size` images deterministically from
/// `seed`: each class is a fixed random pattern of blurred blobs, and each
/// image is its class's pattern shifted by up to 2 pixels, dimmed, and
/// covered with noise. A small convolutional network learns it in one epoch,
/// but not in a few steps. Every rank generates the same set from the same
/// seed.
Split make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed);

} // namespace mnist

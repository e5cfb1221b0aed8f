//! The recurrent core of `--use_rnn`: a GRU or an LSTM of `--rnn_num_layers` layers of
//! `--rnn_size` units between the encoder and the heads.
//!
//! Its state travels as one row of values per env (what the trajectory slots hold): the hidden
//! state of each layer in turn, then, for an LSTM, the cell state of each layer in turn.

use tch::nn::{self, RNN};
use tch::Tensor;

use crate::config::{ModelConfig, RnnType};

enum Cell {
    Gru(nn::GRU),
    Lstm(nn::LSTM),
}

/// A recurrent core.
pub(super) struct Core {
    cell: Cell,
    layers: i64,
    size: i64,
}

impl Core {
    /// The core `cfg` asks for over inputs of `inputs` values, and its output size.
    pub(super) fn new(path: &nn::Path<'_>, inputs: i64, cfg: &ModelConfig) -> (Self, i64) {
        let (layers, size) = (cfg.rnn_num_layers as i64, cfg.rnn_size as i64);
        let config = nn::RNNConfig {
            num_layers: layers,
            batch_first: true,
            ..Default::default()
        };
        let cell = match cfg.rnn_type {
            RnnType::Gru => Cell::Gru(nn::gru(path, inputs, size, config)),
            RnnType::Lstm => Cell::Lstm(nn::lstm(path, inputs, size, config)),
        };
        (Self { cell, layers, size }, size)
    }

    /// Values of state per env.
    pub(super) fn state_dim(&self) -> i64 {
        match self.cell {
            Cell::Gru(_) => self.layers * self.size,
            Cell::Lstm(_) => 2 * self.layers * self.size,
        }
    }

    /// One step for a batch: inputs `[B, inputs]` and states `[B, state_dim]` in, the last layer's
    /// output `[B, size]` and the next states `[B, state_dim]` out.
    pub(super) fn step(&self, x: &Tensor, state: &Tensor) -> (Tensor, Tensor) {
        let b = x.size()[0];
        let x = x.unsqueeze(1);
        // [B, layers * size] -> [layers, B, size], as libtorch's cells take it.
        let layered = |s: &Tensor| {
            s.reshape([b, self.layers, self.size])
                .transpose(0, 1)
                .contiguous()
        };
        let flat = |s: &Tensor| s.transpose(0, 1).reshape([b, self.layers * self.size]);
        let part = self.layers * self.size;
        match &self.cell {
            Cell::Gru(gru) => {
                let (out, nn::GRUState(h)) = gru.seq_init(&x, &nn::GRUState(layered(state)));
                (out.squeeze_dim(1), flat(&h))
            }
            Cell::Lstm(lstm) => {
                let h = layered(&state.narrow(1, 0, part));
                let c = layered(&state.narrow(1, part, part));
                let (out, nn::LSTMState((h, c))) = lstm.seq_init(&x, &nn::LSTMState((h, c)));
                (out.squeeze_dim(1), Tensor::cat(&[flat(&h), flat(&c)], 1))
            }
        }
    }
}

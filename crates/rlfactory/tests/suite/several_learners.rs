//! Several learners of one policy: learners on different data whose gradients are averaged over a learner communicator
//! hold bit-identical weights. In a test binary of its own: libtorch's random generator is one per process, and the
//! learners draw from it (minibatch order) while they train.

use crate::common;

use common::cartpole_dataset;
use rlf_comm::{Comm, LocalComm, LocalWorld};
use rlf_env::EnvRegistry;
use rlfactory::algo::allreduce::AllreduceGradients;
use rlfactory::algo::appo::{Appo, Dataset};
use rlfactory::algo::OnPolicyAlgo;
use rlfactory::config::Config;
use rlfactory::model::{ActorCritic, Policy, PolicyWeights};

/// Rank `rank`'s learner: its own initial weights replaced by rank 0's (broadcast over `comm`, as a data-parallel
/// run starts), trained on three datasets of its own (rewards of 1 on rank 0, −1 on rank 1), its gradients
/// averaged over `comm` when `averaged`. Returns its weights at the start and after each dataset.
fn learner(rank: usize, comm: LocalComm, averaged: bool) -> (Vec<f32>, Vec<Vec<f32>>) {
    let cfg = Config::for_env(
        "CartPole-v1",
        &[
            "normalize_input = false",
            "normalize_returns = false",
            "lr_schedule = 'constant'",
            "batch_size = 64",
            "num_batches_per_epoch = 2",
        ],
    )
    .unwrap();
    let env = EnvRegistry::with_builtin().make("CartPole-v1").unwrap();
    let model = ActorCritic::new(
        env.observation_space(),
        env.action_space(),
        &cfg.model,
        cfg.run.device,
    )
    .unwrap();
    let mut appo = Appo::new(model, &cfg, 1_000_000).unwrap();
    let mut bytes: Vec<u8> = appo
        .model()
        .weights()
        .unwrap()
        .values
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    comm.bcast(0, &mut bytes).unwrap();
    let values = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    appo.model_mut().load_weights(&PolicyWeights { values }).unwrap();
    let start = appo.model().weights().unwrap().values;
    if averaged {
        appo.set_gradient_sync(Box::new(AllreduceGradients::new(Box::new(comm), 1)));
    }
    let reward = if rank == 0 { 1.0 } else { -1.0 };
    let after = (0..3)
        .map(|_| {
            let data = cartpole_dataset(&[1.0; 128]);
            let data = Dataset {
                rewards: &data.rewards * reward,
                ..data
            };
            appo.train(&data).unwrap();
            appo.model().weights().unwrap().values
        })
        .collect();
    (start, after)
}

fn on_two(averaged: bool) -> Vec<(Vec<f32>, Vec<Vec<f32>>)> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = LocalWorld::create(2)
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| scope.spawn(move || learner(rank, comm, averaged)))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

fn differing(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// Two APPO learners (two threads of a local world), the same start, different data, gradients averaged at every
/// SGD step: their weights are bit-identical after each of three datasets of 2 minibatches, and they have moved;
/// without the averaging the same two learners part ways.
#[test]
fn learners_that_average_gradients_hold_bit_identical_weights() {
    let _turn = crate::common::torch_rng();
    let synced = on_two(true);
    assert_eq!(synced[0].0, synced[1].0, "the same start");
    for (k, (a, b)) in synced[0].1.iter().zip(&synced[1].1).enumerate() {
        assert!(a == b, "dataset {k}: {} values differ", differing(a, b));
    }
    assert!(
        differing(&synced[0].0, &synced[0].1[2]) > 0,
        "the learners trained"
    );
    let apart = on_two(false);
    assert!(
        differing(&apart[0].1[2], &apart[1].1[2]) > 0,
        "without averaging the learners part ways"
    );
}

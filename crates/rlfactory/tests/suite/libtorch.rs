//! libtorch loads through the rpath and computes.

#[test]
fn matmul_runs() {
    let _turn = crate::common::torch_rng();
    tch::set_num_threads(1);
    let a = tch::Tensor::from_slice(&[1.0_f32, 2.0, 3.0, 4.0]).view([2, 2]);
    let b = a.matmul(&a);
    assert_eq!(
        Vec::<f32>::try_from(b.view([-1])).unwrap(),
        [7.0, 10.0, 15.0, 22.0]
    );
}

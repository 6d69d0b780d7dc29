use std::time::Instant;
use candle_core::{DType, Device, Tensor};
fn main() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let e = Tensor::randn(0f32, 1.0, (1024, 64), &dev)?;
    for _ in 0..3 {
        let t = Instant::now();
        let g = approx_bench::numerics::spectral::gram(&e)?;
        let t1 = t.elapsed();
        let t = Instant::now();
        let pr = approx_bench::numerics::spectral::power_iteration(&g, 1);
        let t2 = t.elapsed();
        let t = Instant::now();
        let ex = approx_bench::numerics::spectral::exact_lambda_max(&g);
        let t3 = t.elapsed();
        let t = Instant::now();
        let e64 = e.to_dtype(DType::F64)?;
        let _g2 = e64.t()?.matmul(&e64)?;
        let t4 = t.elapsed();
        let t = Instant::now();
        let _g3 = e.t()?.contiguous()?.matmul(&e)?;
        let t5 = t.elapsed();
        println!("gram {t1:?} power {t2:?} ({} steps) eig {t3:?} f64 matmul {t4:?} f32 matmul {t5:?} {} {}", pr.steps, pr.lambda, ex);
    }
    Ok(())
}

//! Runs the server loop on GPU 0 and prints what every step's check found.

fn main() {
    let opts = nsa_server_loop::Options::default();
    match nsa_server_loop::run(&opts) {
        Ok(report) => {
            for c in &report.checks {
                println!("{c}");
            }
            let failed = report.checks.iter().filter(|c| !c.passed()).count();
            println!(
                "{} prefill steps, {} decode steps ({} CUDA graphs), {} requests admitted, {} retired; {failed} of {} checks failed",
                report.prefill_steps,
                report.decode_steps,
                report.graphs,
                report.admitted,
                report.retired,
                report.checks.len()
            );
            if failed > 0 {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("nsa-server-loop: {e}");
            std::process::exit(2);
        }
    }
}

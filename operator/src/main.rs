//! `basalt-operator`: runs the controllers, or prints/writes the CRDs.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "basalt-operator",
    version,
    about = "Basalt's Kubernetes operator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the CustomResourceDefinitions as YAML: one file per CRD into --out, or all to stdout.
    Crd {
        /// Directory to write `<plural>.basalt.dev.yaml` files into.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { out } => write_crds(out),
    }
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    match out {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            for (file, yaml) in basalt_operator::crd::crd_files()? {
                std::fs::write(dir.join(file), yaml)?;
            }
        }
        None => {
            for (_, yaml) in basalt_operator::crd::crd_files()? {
                print!("---\n{yaml}");
            }
        }
    }
    Ok(())
}

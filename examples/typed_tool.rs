// A tool with typed arguments: the JSON Schema the model sees is derived from the Rust
// types, and the arguments arrive parsed and checked against it (a bad call goes back to
// the model as an `invalid_input` error, never reaching `call`).
//
// The model is KEEL_MODEL (default openai:gpt-4.1-mini; OPENAI_API_KEY and
// OPENAI_BASE_URL are read as usual): `cargo run -p keel --example typed_tool`.
use keel::prelude::*;
use serde::{Deserialize, Serialize};

/// The arguments of `convert_temperature`.
#[derive(Deserialize, JsonSchema)]
struct ConvertArgs {
    /// The temperature to convert.
    value: f64,
    /// The unit it is given in.
    from: Unit,
}

/// A temperature unit.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Unit {
    Celsius,
    Fahrenheit,
}

/// The converted temperature.
#[derive(Serialize, JsonSchema)]
struct Converted {
    value: f64,
    unit: &'static str,
}

struct ConvertTemperature;

impl Tool for ConvertTemperature {
    type Args = ConvertArgs;
    type Output = Converted;

    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "convert_temperature",
            "Convert a temperature between Celsius and Fahrenheit.",
            "convert_temperature — Usage Guide\n\nUse it for every temperature conversion.\n\
             Good usage: {\"value\": 21, \"from\": \"celsius\"}",
        )
    }

    async fn call(&self, args: ConvertArgs, _ctx: &ToolContext) -> Result<Converted, ToolError> {
        if !args.value.is_finite() {
            return Err(ToolError::invalid_input("value must be a finite number"));
        }
        Ok(match args.from {
            Unit::Celsius => Converted {
                value: args.value * 9.0 / 5.0 + 32.0,
                unit: "fahrenheit",
            },
            Unit::Fahrenheit => Converted {
                value: (args.value - 32.0) * 5.0 / 9.0,
                unit: "celsius",
            },
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::var("KEEL_MODEL").unwrap_or_else(|_| "openai:gpt-4.1-mini".into());
    let model = keel::providers::model_from_spec(&spec, &Default::default())?;
    let agent = keel::Agent::builder("converter", model)
        .instructions("Convert temperatures with the convert_temperature tool.")
        .tool(ConvertTemperature)
        .build()?;
    println!("{}", agent.prompt("What is 21 °C in Fahrenheit?").await?);
    Ok(())
}
